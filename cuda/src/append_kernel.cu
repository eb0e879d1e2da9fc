// Quantized append: K rows -> q8_0 blocks, V rows -> q5_1 blocks, bit-exact with
// reference/src/quantize.cpp (SPEC §3). One warp per 32-value block: lane j loads value j
// (coalesced); the block quantizers (quantize_warp.cuh) reduce with warp shuffles.
//
// NOTE: exactness rests on IEEE arithmetic with explicit rounding intrinsics and on this
// target's -fmad=false --prec-div=true --ftz=false (cuda/CMakeLists.txt); never fast-math.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "append_kernel.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/status.hpp"
#include "quantize_warp.cuh"

namespace kvlayer::cuda::detail {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr long long kMaxGrid = 1 << 20;  ///< the warp loop strides past this

constexpr int kPlaneK = 0;
constexpr int kPlaneV = 1;

/// Element i of a row buffer, converted exactly to f32.
template <DType T>
__device__ inline float load_value(const void* p, long long i) {
  if constexpr (T == DType::f32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::f16) {
    const unsigned short h = static_cast<const unsigned short*>(p)[i];
    // NOTE: Inf/NaN by hand: the reported bad value must keep a NaN's payload bit for bit, as
    // the reference's conversion does; the hardware conversion need not.
    if ((h & 0x7C00u) == 0x7C00u)
      return __uint_as_float((unsigned(h & 0x8000u) << 16) | 0x7F800000u |
                             (unsigned(h & 0x3FFu) << 13));
    return __half2float(__ushort_as_half(h));
  } else {
    return __uint_as_float(unsigned(static_cast<const unsigned short*>(p)[i]) << 16);
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
  const long long per_row = kb + vb;
  const long long total = a.n * per_row;
  const long long warps_in_grid = static_cast<long long>(gridDim.x) * kWarpsPerBlock;
  // NOTE: `w` is the same on every lane of a warp, so whole warps iterate and exit together.
  for (long long w = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       w < total; w += warps_in_grid) {
    const long long r = w / per_row;
    const long long b = w % per_row;
    float bad = 0.0f;
    if (b < kb) {
      const float x = load_value<T>(a.k, r * a.kv_dim_k + b * kBlockValues + lane);
      std::uint8_t* blk = a.k_plane + (physical0 + r) * a.k_tok_bytes + b * kQ8_0BlockBytes;
      if (quantize_q8_0_warp(x, blk, lane, &bad) && lane == 0)
        record_data_error(a.status, logical0 + r, kPlaneK, b, bad);
    } else {
      const long long vblock = b - kb;
      const float x = load_value<T>(a.v, r * a.kv_dim_v + vblock * kBlockValues + lane);
      std::uint8_t* blk = a.v_plane + (physical0 + r) * a.v_tok_bytes + vblock * kQ5_1BlockBytes;
      if (quantize_q5_1_warp(x, blk, lane, &bad) && lane == 0)
        record_data_error(a.status, logical0 + r, kPlaneV, vblock, bad);
    }
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
  const long long warps = a.n * (a.kv_dim_k / kBlockValues + a.kv_dim_v / kBlockValues);
  if (warps <= 0) return cudaSuccess;
  const dim3 grid(
      static_cast<unsigned>(std::min((warps + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxGrid)));
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
