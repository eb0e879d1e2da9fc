// Warpgroup MMA (wgmma, sm_90a) for decode_wgmma_verify.cu: the two shapes it issues, their
// fences and groups, and the shared-memory operand descriptor (PTX ISA 9.7.15). Compiled only where
// __CUDA_ARCH_FEAT_SM90_ALL is defined (an sm_90a target); elsewhere nothing here is emitted.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode/wgmma_operand_layout.hpp"

namespace kvlayer::cuda::detail::decode_impl {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/// The descriptor of an operand in shared memory with 128-byte swizzling
/// (wgmma_desc_sw128_bits, wgmma_operand_layout.hpp).
__device__ __forceinline__ std::uint64_t wgmma_desc_sw128(const void* smem, int lbo, int sbo) {
  return wgmma_desc_sw128_bits(static_cast<std::uint32_t>(__cvta_generic_to_shared(smem)), lbo,
                               sbo);
}

/// Orders this thread's register and shared-memory accesses before the wgmma issued after it.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/// Generic-proxy writes to shared memory (st.shared) made visible to the async proxy (wgmma):
/// every writing thread, before the barrier that hands the operand over.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/// Pins accumulator registers: no access to them moves across this point (a wgmma in flight
/// writes them behind the compiler's back until its wait).
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// d (+)= A·B, m64n64k16, f32 += f16·f16: A from registers (warp w of the warpgroup: rows
/// 16w … 16w + 15 as mma.m16n8k16's A fragment), B (k16 × n64) K-major in shared memory by
/// `desc`; accumulate 0: d = A·B. d: per 8 columns j, d[4j], d[4j + 1] row g, columns
/// 8j + 2t, + 1; d[4j + 2], d[4j + 3] row g + 8 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const unsigned (&a)[4],
                                                std::uint64_t desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate)
      : "memory");
}

/// d (+)= A·B, m64n128k16 with B (k16 × n128) MN-major (transposed: n contiguous) in shared
/// memory by `desc`; A and d as wgmma_m64n64k16's, 16 column blocks of 8.
__device__ __forceinline__ void wgmma_m64n128k16_bt(float (&d)[64], const unsigned (&a)[4],
                                                    std::uint64_t desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate)
      : "memory");
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace kvlayer::cuda::detail::decode_impl
