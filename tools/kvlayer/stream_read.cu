#include "stream_read.hpp"

namespace kvlayer::cli {
namespace {

__global__ void stream_read_kernel(const uint4* __restrict__ data, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four independent loads in flight per iteration.
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride],
                d = data[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = data[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;  // practically never; keeps the loads live
}

__device__ std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(float* out, std::size_t n, std::uint64_t seed) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint64_t h = mix(seed * 0x9E3779B97F4A7C15ull + i);
    // Sum of four uniforms, centred and scaled: close enough to N(0,1) for timing.
    float s = 0;
    for (int k = 0; k < 4; ++k) s += float((h >> (16 * k)) & 0xFFFF) * (1.0f / 65536.0f);
    out[i] = (s - 2.0f) * 1.7320508f;
  }
}

}  // namespace

cudaError_t launch_stream_read(const void* data, std::size_t bytes, unsigned* sink, int blocks,
                               cudaStream_t stream) {
  stream_read_kernel<<<blocks, 512, 0, stream>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  return cudaGetLastError();
}

cudaError_t launch_fill_random(float* out, std::size_t n, std::uint64_t seed, cudaStream_t stream) {
  fill_random_kernel<<<1024, 256, 0, stream>>>(out, n, seed);
  return cudaGetLastError();
}

}  // namespace kvlayer::cli
