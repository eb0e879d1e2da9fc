// Quantized append: K rows -> q8_0 blocks, V rows -> q5_1 blocks, bit-exact with
// reference/src/quantize.cpp (SPEC §3). One warp per 32-value block: lane j loads value j
// (coalesced) and reductions are warp shuffles.
//
// NOTE: exactness rests on IEEE arithmetic written out with explicit rounding intrinsics
// (__fdiv_rn, __frcp_rn, __fsub_rn, __fmul_rn, __fadd_rn) and on this target's -fmad=false
// --prec-div=true --ftz=false (cuda/CMakeLists.txt); never build it with fast-math.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "append_kernel.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer::cuda::detail {
namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr unsigned short kNaNHalf = 0x7E00;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr long long kMaxGrid = 1 << 20;  ///< the warp loop strides past this

constexpr int kPlaneK = 0;
constexpr int kPlaneV = 1;

__device__ inline bool is_finite(float x) {
  return (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u;
}

__device__ inline bool is_inf_half(unsigned short h) {
  return (h & 0x7FFFu) == 0x7C00u;
}

/// f32 -> fp16 bits, round-to-nearest-even (SPEC §2 scale storage).
__device__ inline unsigned short half_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}

/// NOTE: a 16-bit store, never a byte-wise copy: K blocks are only 2-byte aligned, and a
/// memcpy of an fp16 into bytes once miscompiled (FIELD-NOTES).
__device__ inline void store_u16(std::uint8_t* p, unsigned short v) {
  *reinterpret_cast<unsigned short*>(p) = v;
}

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

__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

__device__ inline float warp_min(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fminf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

/// The x of the lowest lane where `pred` holds (pred must hold somewhere).
__device__ inline float first_where(bool pred, float x) {
  const unsigned m = __ballot_sync(kFullMask, pred);
  return __shfl_sync(kFullMask, x, __ffs(int(m)) - 1);
}

/// IEEE reciprocal, or 0 when d is 0 or 1/d is not finite (SPEC §3 degenerate blocks).
__device__ inline float safe_reciprocal(float d) {
  if (d == 0.0f) return 0.0f;
  const float r = __frcp_rn(d);
  return is_finite(r) ? r : 0.0f;
}

/// The value a bad block is reported with: its first non-finite value, else the first value of
/// largest magnitude (reference offending_value). Warp-uniform call.
__device__ inline float offending_value(float x, unsigned nonfinite_lanes) {
  if (nonfinite_lanes != 0) return __shfl_sync(kFullMask, x, __ffs(int(nonfinite_lanes)) - 1);
  const float amax = warp_max(fabsf(x));  // all finite: exact, the same on every lane
  return first_where(fabsf(x) == amax, x);
}

/// Quantizes the warp's 32 values (lane j holds x_j) into the q8_0 block at blk. Returns true
/// (and the offending value) when the block was written as the canonical bad block.
/// NOTE: every branch below is warp-uniform (ballots, or reductions of finite values, which
/// are exact and agree on every lane), so the full-mask shuffles are legal.
__device__ bool quantize_q8_0(float x, std::uint8_t* blk, int lane, float* bad_value) {
  const unsigned nonfinite = __ballot_sync(kFullMask, !is_finite(x));
  const float amax = warp_max(fabsf(x));
  const float d = __fdiv_rn(amax, 127.0f);
  const unsigned short dh = half_bits(d);
  if (nonfinite != 0 || is_inf_half(dh)) {
    *bad_value = offending_value(x, nonfinite);
    blk[2 + lane] = 0;
    if (lane == 0) store_u16(blk, kNaNHalf);
    return true;
  }
  const float id = safe_reciprocal(d);
  const float q = roundf(__fmul_rn(x, id));  // round half away from zero; |q| ≤ 127
  blk[2 + lane] = static_cast<std::uint8_t>(static_cast<std::int8_t>(static_cast<int>(q)));
  if (lane == 0) store_u16(blk, dh);
  return false;
}

/// Quantizes the warp's 32 values into the q5_1 block at blk (24 bytes, 8-byte aligned).
__device__ bool quantize_q5_1(float x, std::uint8_t* blk, int lane, float* bad_value) {
  const unsigned nonfinite = __ballot_sync(kFullMask, !is_finite(x));
  if (nonfinite != 0) {
    *bad_value = offending_value(x, nonfinite);
  } else {
    // NOTE: the reference keeps the FIRST element attaining the min (max): take that lane's
    // own value so that the sign of a zero extreme matches (it reaches fp16(min) and d).
    const float lo = first_where(x == warp_min(x), x);
    const float hi = first_where(x == warp_max(x), x);
    const float d = __fdiv_rn(__fsub_rn(hi, lo), 31.0f);
    const unsigned short dh = half_bits(d);
    const unsigned short mh = half_bits(lo);
    if (is_finite(d) && !is_inf_half(dh) && !is_inf_half(mh)) {
      const float id = safe_reciprocal(d);
      const float scaled = __fmul_rn(__fsub_rn(x, lo), id);  // one f32 multiply ...
      const float shifted = __fadd_rn(scaled, 0.5f);         // ... then one f32 add, never fused
      const unsigned q = static_cast<unsigned>(shifted);     // truncation; 0 ≤ q ≤ 31
      const unsigned qh = __ballot_sync(kFullMask, (q >> 4) & 1u);
      const unsigned q_hi = __shfl_down_sync(kFullMask, q, 16);
      if (lane < 16) blk[8 + lane] = static_cast<std::uint8_t>((q & 0xFu) | ((q_hi & 0xFu) << 4));
      if (lane == 0) {
        store_u16(blk, dh);
        store_u16(blk + 2, mh);
        *reinterpret_cast<unsigned*>(blk + 4) = qh;  // little-endian, 4-byte aligned
      }
      return false;
    }
    *bad_value = offending_value(x, 0);
  }
  if (lane < 16) blk[8 + lane] = 0;
  if (lane == 0) {
    store_u16(blk, kNaNHalf);
    store_u16(blk + 2, kNaNHalf);
    *reinterpret_cast<unsigned*>(blk + 4) = 0u;
  }
  return true;
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
      if (quantize_q8_0(x, blk, lane, &bad) && lane == 0)
        record_data_error(a.status, logical0 + r, kPlaneK, b, bad);
    } else {
      const long long vblock = b - kb;
      const float x = load_value<T>(a.v, r * a.kv_dim_v + vblock * kBlockValues + lane);
      std::uint8_t* blk = a.v_plane + (physical0 + r) * a.v_tok_bytes + vblock * kQ5_1BlockBytes;
      if (quantize_q5_1(x, blk, lane, &bad) && lane == 0)
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

}  // namespace kvlayer::cuda::detail
