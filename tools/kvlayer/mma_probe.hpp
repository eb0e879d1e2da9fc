// The device half of `kvlayer mma-probe`: one tensor-core step D = A·B + C per tile
// (mma_model.hpp's MmaTile), by mma.sync m16n8k16 (the decode kernels' instruction, four warps
// each taking 16 rows) and by wgmma m64n8k16 (one warpgroup, A from registers, B from shared
// memory through a descriptor; sm_90a builds only).
#pragma once

#include <cuda_runtime_api.h>

#include "mma_model.hpp"

namespace kvlayer::cli {

/// The engines the probe runs.
enum class MmaEngine { mma_sync, wgmma };

/// Writes 1 to *built (device memory) when this build holds the wgmma kernel (compiled for
/// sm_90a), else 0.
cudaError_t launch_wgmma_built(int* built, cudaStream_t stream);

/// D [n][64][8] f32 for the n tiles at `tiles` (device memory). wgmma: B's shared-memory
/// descriptor takes `lbo` and `sbo` (bytes) for its two 8 × 16-byte core matrices along K,
/// stored 128 bytes apart: the probe tries both readings of the descriptor's offsets and keeps
/// the one its exact tiles confirm.
cudaError_t launch_mma_probe(MmaEngine engine, const MmaTile* tiles, int n, float* d, int lbo,
                             int sbo, cudaStream_t stream);

}  // namespace kvlayer::cli
