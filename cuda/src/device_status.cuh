// The sticky device-side error record of a layer (SPEC §3 data errors, §7 headroom/grid
// overruns), written by kernels and read back by the host at a status query.
#pragma once

#include <cuda_runtime_api.h>  // __host__/__device__ for host compilers too

#include <cstdint>

namespace kvlayer::cuda::detail {

/// Lives in device memory, one per layer, zeroed at construction and by clear_status().
/// NOTE: plain struct shared by host and device code; the host copies it back to read it.
struct DeviceStatus {
  int data_lock;         ///< spin lock guarding the data-error fields
  int has_data_error;    ///< 0 or 1
  long long data_key;    ///< (row << 32) | (plane << 31) | block: lowest key is kept
  float data_value;      ///< the offending value of the kept block
  int has_device_error;  ///< claimed 0 -> 1 by the first device error: it sticks
  int device_kind;       ///< kvlayer::DeviceErrorKind
  long long device_len_d;
  long long device_base_d;
  long long device_limit;
};

/// Packs a data-error key; plane 0 = K, 1 = V.
__host__ __device__ inline long long data_error_key(long long row, int plane, long long block) {
  return (row << 32) | (static_cast<long long>(plane) << 31) | block;
}

#ifdef __CUDACC__
/// Records a bad block; keeps the lowest key. Call from one thread per bad block.
/// NOTE: a spin lock is fine here: bad blocks are rare and each warp sends one thread.
__device__ inline void record_data_error(DeviceStatus* s, long long row, int plane, long long block,
                                         float value) {
  const long long key = data_error_key(row, plane, block);
  while (atomicCAS(&s->data_lock, 0, 1) != 0) {
  }
  __threadfence();
  volatile DeviceStatus* vs = s;
  if (!vs->has_data_error || key < vs->data_key) {
    vs->data_key = key;
    vs->data_value = value;
    vs->has_data_error = 1;
  }
  __threadfence();
  atomicExch(&s->data_lock, 0);
}

/// Records a device-counter overrun; the first one recorded sticks.
__device__ inline void record_device_error(DeviceStatus* s, int kind, long long len_d,
                                           long long base_d, long long limit) {
  if (atomicCAS(&s->has_device_error, 0, 1) == 0) {
    s->device_kind = kind;
    s->device_len_d = len_d;
    s->device_base_d = base_d;
    s->device_limit = limit;
  }
}
#endif

}  // namespace kvlayer::cuda::detail
