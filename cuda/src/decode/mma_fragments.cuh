// Register-level helpers shared by the tensor-core split kernels (decode_mma_staged.cu,
// decode_mma_direct.cu, decode_mma_verify.cu): the m16n8k16 f16 mma, ldmatrix, fp16x2 bit casts
// and packing, and the fragment transpose (the block formats' conversions: codec_q8_0.cuh,
// codec_q5_1.cuh).
#pragma once

#include <cuda_fp16.h>

namespace kvlayer::cuda::detail::decode_impl {

/// c += A·B for mma.sync m16n8k16 (f16 × f16 → f32). A: a0 (row g, k 2t..2t+1), a1 (row g+8),
/// a2 (row g, k 2t+8..2t+9), a3 (row g+8, k 2t+8..); B: b0 (k 2t..2t+1, col g), b1 (k 2t+8..);
/// C: c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8). g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma_16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                          unsigned a3, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// The transpose of an 8×8 fp16 matrix held one fp16x2 per lane (row lane / 4, columns
/// 2·(lane % 4) + {0, 1}), in the same layout.
__device__ __forceinline__ unsigned transpose_8x8_f16(unsigned x) {
  unsigned y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

/// ldmatrix.x4: lane l gives the shared address of row l % 8 of 8×8 fp16 matrix l / 8 (16
/// contiguous bytes); r[j] is this lane's fp16x2 of matrix j (row lane / 4, columns
/// 2·(lane % 4) + {0, 1}), or with kTrans of its transpose.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ __forceinline__ unsigned h2_bits(__half2 h) {
  return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ __half2 as_h2(unsigned bits) {
  return *reinterpret_cast<__half2*>(&bits);
}

/// fp16x2 of (lo, hi), each rounded to nearest even; lo in the low half (the lower k/n index).
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
  return h2_bits(__floats2half2_rn(lo, hi));
}

}  // namespace kvlayer::cuda::detail::decode_impl
