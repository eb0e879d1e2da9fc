// The device half of `kvlayer mma-probe`'s operand check: decode_wgmma_verify.cu's fp16 operand
// (wgmma_operand_layout.hpp: K̃ and Ṽ of a 64-key tile, 128-byte swizzle) read by the kernel's
// own instructions and descriptors (wgmma.cuh), on small integers, where every product and sum
// is exact in f32: S = Q·Kᵀ by 8 × m64n64k16 (the operand K-major) and O = P·V by 4 ×
// m64n128k16 (the same bytes MN-major). A wrong layout, descriptor offset or step start reads
// other values and shows as a difference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvlayer::cli {

/// The probe's inputs, fp16 bits: Q [64 rows][128 dims], P [64 rows][64 keys], and the tile
/// K [64 keys][128 dims] (stored once, read as K̃ by QK and as Ṽ by PV).
struct WgmmaOperandInputs {
  static constexpr int kRows = 64, kKeys = 64, kDims = 128;
  std::uint16_t q[kRows][kDims];
  std::uint16_t p[kRows][kKeys];
  std::uint16_t k[kKeys][kDims];
};

/// S [64][64] and O [64][128] (f32, device memory) for the inputs at `in` (device memory), by
/// one warpgroup. swap_pv_offsets: PV's descriptor with its leading and stride offsets swapped
/// (the other reading of the MN-major layout, to tell which one a failure is). Only where
/// launch_wgmma_built (mma_probe.hpp) says this build has sm_90a code.
cudaError_t launch_wgmma_operand_probe(const WgmmaOperandInputs* in, float* s, float* o,
                                       bool swap_pv_offsets, cudaStream_t stream);

}  // namespace kvlayer::cli
