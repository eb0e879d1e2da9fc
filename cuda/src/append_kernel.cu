// Quantized append: K rows -> q8_0 blocks, V rows -> q5_1 blocks, bit-exact with
// reference/src/quantize.cpp (SPEC §3). One thread per 32-value block: it loads the block's
// values as 16-byte vectors and quantizes them in registers (quantize_block.cuh); consecutive
// threads take consecutive blocks (all K blocks of the rows, then all V blocks), so a warp reads
// and writes contiguous bytes.
//
// NOTE: the first version gave each block a warp (lane j value j, shuffle reductions): ~240
// issue slots per block made it issue-bound at 15% of the streaming rate (bench/NOTES.md).
//
// NOTE: exactness rests on IEEE arithmetic with explicit rounding intrinsics and on this
// target's -fmad=false --prec-div=true --ftz=false (cuda/CMakeLists.txt); never fast-math.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "append_kernel.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/status.hpp"
#include "quantize_block.cuh"

namespace kvlayer::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr long long kMaxGrid = 1 << 20;  ///< the block loop strides past this

constexpr int kPlaneK = 0;
constexpr int kPlaneV = 1;

/// One 16-bit input element (f16 or bf16 bits) converted exactly to f32.
template <DType T>
__device__ inline float widen(unsigned short h) {
  if constexpr (T == DType::f16) {
    // NOTE: Inf/NaN by hand: the reported bad value must keep a NaN's payload bit for bit, as
    // the reference's conversion does; the hardware conversion need not.
    if ((h & 0x7C00u) == 0x7C00u)
      return __uint_as_float((unsigned(h & 0x8000u) << 16) | 0x7F800000u |
                             (unsigned(h & 0x3FFu) << 13));
    return __half2float(__ushort_as_half(h));
  } else {
    return __uint_as_float(unsigned(h) << 16);
  }
}

/// The 32 values of the block starting at element `first` of a row buffer, as f32.
/// `vectors`: the buffer is 16-byte aligned (a block is then 128 or 64 aligned bytes).
template <DType T>
__device__ inline void load_block(const void* p, long long first, bool vectors, float (&x)[32]) {
  if constexpr (T == DType::f32) {
    const float* f = static_cast<const float*>(p) + first;
    if (vectors) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 v = reinterpret_cast<const float4*>(f)[i];
        x[4 * i] = v.x;
        x[4 * i + 1] = v.y;
        x[4 * i + 2] = v.z;
        x[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) x[j] = f[j];
    }
  } else {
    const unsigned short* h = static_cast<const unsigned short*>(p) + first;
    if (vectors) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(h)[i];
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          x[8 * i + 2 * k] = widen<T>(static_cast<unsigned short>(w[k] & 0xFFFFu));
          x[8 * i + 2 * k + 1] = widen<T>(static_cast<unsigned short>(w[k] >> 16));
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) x[j] = widen<T>(h[j]);
    }
  }
}

template <DType T, AppendMode M>
__global__ void __launch_bounds__(kThreads) append_kernel(AppendArgs a) {
  const int lane = int(threadIdx.x & 31u);
  long long physical0 = a.physical_row0;
  long long logical0 = a.logical_row0;
  if constexpr (M != AppendMode::host) {
    // Device-counter row (SPEC §7), checked in the reference's order: max_ctx first.
    const long long len = *a.len_d;
    const long long base = M == AppendMode::dcw ? *a.base_d : 0;
    int kind = 0;
    long long limit = 0;
    if (len >= a.max_ctx) {
      kind = int(DeviceErrorKind::append_past_max_ctx);
      limit = a.max_ctx;
    } else if (M == AppendMode::dcw && (len - base < 0 || len - base >= a.rows)) {
      kind = int(DeviceErrorKind::append_outside_rows);
      limit = a.rows;
    }
    if (kind != 0) {
      if (blockIdx.x == 0 && threadIdx.x == 0)
        record_device_error(a.status, kind, len, base, limit);
      return;  // writes nothing
    }
    physical0 = len - base;
    logical0 = len;
  }
  const long long kb = a.kv_dim_k / kBlockValues;
  const long long vb = a.kv_dim_v / kBlockValues;
  const long long k_blocks = a.n * kb;
  const long long total = k_blocks + a.n * vb;
  const bool k_vectors = (reinterpret_cast<std::uintptr_t>(a.k) & 15u) == 0;
  const bool v_vectors = (reinterpret_cast<std::uintptr_t>(a.v) & 15u) == 0;
  const long long threads_in_grid = static_cast<long long>(gridDim.x) * kThreads;
  // NOTE: `first` is the same on every lane of a warp, so whole warps iterate together and the
  // ballot below is legal; lane `lane` takes block first + lane.
  for (long long first = static_cast<long long>(blockIdx.x) * kThreads + (threadIdx.x & ~31u);
       first < total; first += threads_in_grid) {
    const long long i = first + lane;
    bool bad = false;
    float bad_value = 0.0f;
    long long row = 0, block = 0;
    int plane = kPlaneK;
    if (i < k_blocks) {
      row = i / kb;
      block = i % kb;
      float x[32];
      load_block<T>(a.k, row * a.kv_dim_k + block * kBlockValues, k_vectors, x);
      bad = quantize_q8_0_block(
          x, a.k_plane + (physical0 + row) * a.k_tok_bytes + block * kQ8_0BlockBytes, &bad_value);
    } else if (i < total) {
      row = (i - k_blocks) / vb;
      block = (i - k_blocks) % vb;
      plane = kPlaneV;
      float x[32];
      load_block<T>(a.v, row * a.kv_dim_v + block * kBlockValues, v_vectors, x);
      bad = quantize_q5_1_block(
          x, a.v_plane + (physical0 + row) * a.v_tok_bytes + block * kQ5_1BlockBytes, &bad_value);
    }
    // Bad blocks are recorded one lane at a time (the record takes a global lock).
    for (unsigned m = __ballot_sync(0xFFFFFFFFu, bad); m != 0; m &= m - 1)
      if (lane == __ffs(static_cast<int>(m)) - 1)
        record_data_error(a.status, logical0 + row, plane, block, bad_value);
  }
}

template <DType T>
cudaError_t launch_typed(const AppendArgs& a, AppendMode mode, dim3 grid, cudaStream_t s) {
  switch (mode) {
    case AppendMode::host:
      append_kernel<T, AppendMode::host><<<grid, kThreads, 0, s>>>(a);
      break;
    case AppendMode::dc:
      append_kernel<T, AppendMode::dc><<<grid, kThreads, 0, s>>>(a);
      break;
    case AppendMode::dcw:
      append_kernel<T, AppendMode::dcw><<<grid, kThreads, 0, s>>>(a);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_append(const AppendArgs& a, AppendMode mode, cudaStream_t stream) {
  const long long blocks = a.n * (a.kv_dim_k / kBlockValues + a.kv_dim_v / kBlockValues);
  if (blocks <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(std::min((blocks + kThreads - 1) / kThreads, kMaxGrid)));
  switch (a.dtype) {
    case DType::f32:
      return launch_typed<DType::f32>(a, mode, grid, stream);
    case DType::f16:
      return launch_typed<DType::f16>(a, mode, grid, stream);
    case DType::bf16:
      return launch_typed<DType::bf16>(a, mode, grid, stream);
  }
  return cudaErrorInvalidValue;
}

KVLAYER_DEFINE_MUTANT_SETTER(set_append_mutant)

}  // namespace kvlayer::cuda::detail
