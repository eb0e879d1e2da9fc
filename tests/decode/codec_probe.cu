// Device probes of the block codecs (codec_probe.hpp).
#include <cuda_runtime.h>

#include "codec_probe.hpp"
#include "decode/codec_q8_0.cuh"

namespace kvlayer::testing {
namespace {

using namespace kvlayer::cuda::detail::decode_impl;

/// Thread (d, q + 128): the quant pair (q, q) through the codec's own conversion and fold.
__global__ void k_fold_probe(std::uint16_t* out, std::uint8_t* wide, int* halves_differ) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;  // d · 256 + (q + 128)
  const unsigned d = i >> 8, biased = i & 0xffu;
  // int8 q = biased − 128 in both bytes 0 and 1 of a word whose sign bits are flipped (u =
  // w ^ 0x80808080), as convert_tile hands it to int8_pair_to_f16x2.
  const unsigned u = biased | (biased << 8);
  const unsigned r = k_fold_f16x2(int8_pair_to_f16x2(u, 0), d);
  out[i] = static_cast<std::uint16_t>(r & 0xffffu);
  if ((r & 0xffffu) != (r >> 16)) atomicAdd(halves_differ, 1);
  if (biased == 0) wide[d] = k_header_maybe_wide(d) ? 1 : 0;
}

}  // namespace

cudaError_t probe_k_fold(std::uint16_t* out, std::uint8_t* wide, int* halves_differ) {
  k_fold_probe<<<(1u << 24) / 256, 256>>>(out, wide, halves_differ);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  return cudaDeviceSynchronize();
}

}  // namespace kvlayer::testing
