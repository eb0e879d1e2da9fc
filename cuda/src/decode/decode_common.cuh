// Device pieces shared by the two split kernels (decode.cu: CUDA cores, decode_mma.cu: tensor
// cores) and the merge: the view resolution and its device-mode checks, the scratch layout of the
// partial results, the launch parameters and the cp.async wrappers. Moved here unchanged from
// decode.cu so that both kernels obey one definition.
#pragma once

#include "mutants.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "decode/decode.hpp"
#include "decode/partition.hpp"
#include "device_status.cuh"

namespace kvlayer::cuda::detail::decode_impl {

inline constexpr float kNegSentinel = -FLT_MAX;  ///< finite "minus infinity" for m
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int kDecodeViewTooLong = 3;  ///< kvlayer::DeviceErrorKind::decode_view_too_long

/// The view a launch attends, resolved on the device (device-counter mode) or from the host
/// values. Passed by value so a captured graph holds only pointers and layer constants.
struct ViewParams {
  const std::int32_t* len_d;  ///< null: host mode
  const std::int32_t* base_d;
  long long host_len, host_base;
  long long window, rows, max_ctx, max_view;
};

struct View {
  long long begin, end, base;  ///< logical [begin, end) at physical row = logical − base
  long long len, limit;        ///< for the error record
  bool error;
};

/// Resolves and (device mode) checks the view, in the reference's order: len_d past max_ctx
/// (limit max_ctx), then outside the resident rows (limit rows), then longer than the grid
/// (limit max_view_keys). Host-mode views were checked on the host before the launch.
/// NOTE: a negative len_d or base_d (impossible through the layer API) is treated as outside.
__device__ inline View resolve_view(const ViewParams& p) {
  View v{};
  long long base = p.host_base;
  v.len = p.host_len;
  if (p.len_d != nullptr) {
    v.len = *p.len_d;
    base = p.base_d != nullptr ? *p.base_d : 0;
  }
  v.base = base;
  v.end = v.len;
  v.begin = p.window > 0 ? (v.len - p.window > 0 ? v.len - p.window : 0) : 0;
  if (KVLAYER_DEVICE_MUTANT(decode_window_off_by_one) && p.window > 0 && v.begin < v.len)
    ++v.begin;  // planted bug: one key too few
  if (p.len_d != nullptr) {
    if (v.len < 0 || v.len > p.max_ctx) {
      v.error = true;
      v.limit = p.max_ctx;
    } else if (base < 0 || v.begin < base || v.len - base > p.rows) {
      v.error = true;
      v.limit = p.rows;
    } else if (v.end - v.begin > p.max_view) {
      v.error = true;
      v.limit = p.max_view;
    }
  }
  return v;
}

/// End of the keys [lo, ·) a split attends: lo + kps, clipped to the view.
__device__ inline long long split_end(long long lo, long long kps, long long view_end) {
  const long long hi = lo + kps < view_end ? lo + kps : view_end;
  if (KVLAYER_DEVICE_MUTANT(split_drops_last_key) && hi > lo) return hi - 1;  // planted bug
  return hi;
}

/// Partial results of one (KV head, split): o[gqa][D], m[gqa], l[gqa] at fixed offsets.
struct Scratch {
  float* o;
  float* m;
  float* l;
};

__host__ __device__ inline Scratch scratch_layout(void* base, int n_kv, int n_splits, int gqa,
                                                  int d) {
  float* f = static_cast<float*>(base);
  const long long parts = (long long)n_kv * n_splits * gqa;
  return Scratch{f, f + parts * d, f + parts * d + parts};
}

struct SplitParams {
  ViewParams view;
  const std::uint8_t* k_plane;
  const std::uint8_t* v_plane;
  long long k_tok_bytes, v_tok_bytes;
  const float* q;
  float scale;
  int gqa, n_splits;
  void* scratch;
  DeviceStatus* status;
};

// ---- cp.async (sm_80+) ---------------------------------------------------------------------

template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16) {
    // .cg: stream through L2 only; the cache is read once per decode.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(kBytes));
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ float f16_bits(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

/// Enqueues the tensor-core split kernel (decode_mma.cu) for plan.head_dim / plan.gqa.
cudaError_t launch_split_mma(const SplitParams& sp, const DecodePlan& plan, dim3 grid,
                             cudaStream_t stream);

}  // namespace kvlayer::cuda::detail::decode_impl
