// Host side of `kvlayer mma-probe`: what a tensor-core step D = A·B + C (fp16 × fp16 → f32,
// k = 16) must return under accuracy.hpp's rounding point (5), computed exactly. The probe's
// tiles, the exact dot in 128-bit fixed point, the declared bound's ratio, and the family of
// alignment-truncation models the published measurements describe (products exact, addends
// aligned to the largest one's exponent keeping p bits, summed, the result truncated to f32).
// No CUDA here, so that the arithmetic is tested on a machine without a GPU.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlayer::cli {

/// One probe tile: the shape of a wgmma m64n8k16 (four mma.sync m16n8k16 tiles stacked in M,
/// sharing B). A row-major [64][16] and B [16][8] (k, n) as fp16 bits, C [64][8] f32.
struct MmaTile {
  static constexpr int kM = 64, kN = 8, kK = 16;
  std::uint16_t a[kM][kK];
  std::uint16_t b[kK][kN];
  float c[kM][kN];
};

/// The kinds of tiles make_mma_tiles draws, tile t taking kind t % kMmaTileKinds:
///  0 small integers (every result exact in f32: a layout self-check, no rounding),
///  1 random signs and exponents (fp16 2^-14 … 2^8, C 2^-20 … 2^12),
///  2 cancellation (C = −RN_f32(Σ a·b): the result is tiny beside Σ|addends|),
///  3 one large product among small ones, C zero or large.
inline constexpr int kMmaTileKinds = 4;
std::vector<MmaTile> make_mma_tiles(int n, std::uint64_t seed);

/// Element (i, j) of a tile, exactly: Σ_k a_ik·b_kj + c_ij and Σ|addends| (the 16 products and
/// C), as long double (the exact sum is kept in 128-bit fixed point until then).
struct ExactDot {
  long double value = 0, abs_sum = 0;
};
ExactDot exact_dot(const MmaTile& t, int i, int j);

/// |got − exact| / (2^-24 · Σ|addends|): the error in units of u32 of the addends' magnitude.
/// accuracy.hpp (5) declares at most kMmaDeclaredRatio (γ = 2(k + 2)·u32 = 36·u32). A
/// non-finite `got` gives infinity.
inline constexpr double kMmaDeclaredRatio = 36;
double error_ratio(const MmaTile& t, int i, int j, float got);

/// The alignment-truncation model with p bits: each product (exact) and C truncated toward
/// zero to a multiple of 2^(e_max − p + 1), e_max the largest addend's exponent, summed exactly,
/// the sum truncated toward zero to 24 significant bits.
float truncation_model(const MmaTile& t, int i, int j, int p);

}  // namespace kvlayer::cli
