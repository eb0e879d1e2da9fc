// Device probes of the block codecs (cuda/src/decode/codec_q8_0.cuh), for
// test_codec_cuda.cpp: the kernels' own inline functions run over host-chosen inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvlayer::testing {

/// For every d (fp16 bits 0 … 65535) and every int8 quant q: out[d·256 + (q + 128)] = the fp16
/// bits of d·q as convert_tile makes them (int8_pair_to_f16x2, then k_fold_f16x2, of the pair
/// (q, q): the low half; *halves_differ counts pairs whose halves differ), and wide[d] =
/// k_header_maybe_wide(d). out: 2^24 uint16, wide: 2^16 bytes, halves_differ: one int, zeroed
/// by the caller. Synchronous.
cudaError_t probe_k_fold(std::uint16_t* out, std::uint8_t* wide, int* halves_differ);

}  // namespace kvlayer::testing
