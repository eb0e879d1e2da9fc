// Launcher of the quantized append (append_kernel.cu): K rows -> q8_0, V rows -> q5_1.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "batch_slots.hpp"
#include "device_status.cuh"
#include "kvlayer/dtype.hpp"

namespace kvlayer::cuda::detail {

/// Where the rows go.
enum class AppendMode : std::uint8_t {
  host,  ///< n rows at physical_row0 (logical_row0), both given by value
  dc,    ///< n rows (a draft step: SPEC §11) at physical *len_d (flat layers)
  dcw,   ///< n rows at physical *len_d − *base_d (any layer)
};

/// One append launch. Pointers are device pointers.
struct AppendArgs {
  const void* k = nullptr;  ///< n × kv_dim_k elements of `dtype`, row-major
  const void* v = nullptr;  ///< n × kv_dim_v elements
  DType dtype = DType::f32;
  std::int64_t n = 0;
  std::int64_t kv_dim_k = 0, kv_dim_v = 0;
  std::uint8_t* k_plane = nullptr;
  std::uint8_t* v_plane = nullptr;
  std::int64_t k_tok_bytes = 0, v_tok_bytes = 0;
  std::int64_t physical_row0 = 0;        ///< host mode
  std::int64_t logical_row0 = 0;         ///< host mode
  const std::int32_t* len_d = nullptr;   ///< dc, dcw
  /// Host mode: when set, the kernel also stores logical_row0 + n there (the layer's len_d), so
  /// that an append is one launch.
  std::int32_t* host_len_d_out = nullptr;
  const std::int32_t* base_d = nullptr;  ///< dcw
  std::int64_t rows = 0;                 ///< physical rows of each plane (dcw bound)
  std::int64_t max_ctx = 0;              ///< dc, dcw bound
  DeviceStatus* status = nullptr;
  /// A batch append (SPEC §12, dc and dcw) when batch.slots != null: position j < *n_active
  /// writes rows [j·n, (j + 1)·n) of k and v to sequence active[j] at its own counters (the
  /// planes, len_d, base_d and status above are then unused); max_batch positions.
  BatchList batch{};
  int max_batch = 0;
};

/// Enqueues the append on `stream` (one thread per 32-value block). Capturable: reads the
/// device-counter row from device memory at run time, allocates nothing, never synchronizes.
/// In dc/dcw mode a row outside the plane or at/after max_ctx writes nothing and records a
/// DeviceError (SPEC §7); bad blocks are written canonically and recorded (SPEC §3).
cudaError_t launch_append(const AppendArgs& args, AppendMode mode, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail
