#include <cstdint>

#include "mma_probe.hpp"

namespace kvlayer::cli {
namespace {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVLAYER_WGMMA_PROBE 1
#endif

/// Two fp16 bits as one f16x2 register, the lower index in the low half.
__device__ __forceinline__ unsigned pack(std::uint16_t lo, std::uint16_t hi) {
  return unsigned(lo) | (unsigned(hi) << 16);
}

/// Warp w's A fragment of rows 16w … 16w + 15 (mma.m16n8k16's layout, which wgmma's register A
/// of m64nNk16 repeats per warp): a0 (row g, k 2t, 2t+1), a1 (row g + 8, same k), a2 (row g,
/// k 2t + 8, 2t + 9), a3 (row g + 8, k 2t + 8, 2t + 9).
__device__ __forceinline__ void a_fragment(const MmaTile& t, int w, int g, int tq,
                                           unsigned (&a)[4]) {
  const int r0 = 16 * w + g, r1 = r0 + 8, k0 = 2 * tq, k1 = k0 + 8;
  a[0] = pack(t.a[r0][k0], t.a[r0][k0 + 1]);
  a[1] = pack(t.a[r1][k0], t.a[r1][k0 + 1]);
  a[2] = pack(t.a[r0][k1], t.a[r0][k1 + 1]);
  a[3] = pack(t.a[r1][k1], t.a[r1][k1 + 1]);
}

/// One tile per block of 128 threads: warp w takes rows 16w … 16w + 15 by one mma.sync.
__global__ void mma_sync_probe_kernel(const MmaTile* tiles, float* d) {
  const MmaTile& t = tiles[blockIdx.x];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, tq = lane % 4;
  unsigned a[4];
  a_fragment(t, w, g, tq, a);
  const unsigned b0 = pack(t.b[2 * tq][g], t.b[2 * tq + 1][g]);
  const unsigned b1 = pack(t.b[2 * tq + 8][g], t.b[2 * tq + 9][g]);
  const int r0 = 16 * w + g, r1 = r0 + 8, c0 = 2 * tq;
  float c[4] = {t.c[r0][c0], t.c[r0][c0 + 1], t.c[r1][c0], t.c[r1][c0 + 1]};
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  float* out = d + std::size_t(blockIdx.x) * MmaTile::kM * MmaTile::kN;
  out[r0 * MmaTile::kN + c0] = c[0];
  out[r0 * MmaTile::kN + c0 + 1] = c[1];
  out[r1 * MmaTile::kN + c0] = c[2];
  out[r1 * MmaTile::kN + c0 + 1] = c[3];
}

/// One tile per warpgroup block: D = A·B + C by one wgmma m64n8k16, A from registers, B K-major
/// from shared memory (core matrix c = K columns 8c … 8c + 7: 8 rows n of 16 bytes, at byte
/// 128·c), no swizzle. The rest of the 1-KB buffer is zeros, so that a descriptor reading the
/// second core matrix elsewhere stays inside it (and fails the integer check).
__global__ void wgmma_probe_kernel(const MmaTile* tiles, float* d, int lbo, int sbo) {
#ifdef KVLAYER_WGMMA_PROBE
  __shared__ __align__(1024) std::uint16_t b_s[8][8][8];  // [core matrix][n][k % 8]
  const MmaTile& t = tiles[blockIdx.x];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, tq = lane % 4;
  for (int i = threadIdx.x; i < 8 * 8 * 8; i += blockDim.x) (&b_s[0][0][0])[i] = 0;
  __syncthreads();
  {
    const int k = threadIdx.x / 8, n = threadIdx.x % 8;  // 128 threads: the 16 × 8 values
    b_s[k / 8][n][k % 8] = t.b[k][n];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  unsigned a[4];
  a_fragment(t, w, g, tq, a);
  const int r0 = 16 * w + g, r1 = r0 + 8, c0 = 2 * tq;
  float c[4] = {t.c[r0][c0], t.c[r0][c0 + 1], t.c[r1][c0], t.c[r1][c0 + 1]};
  const auto addr = static_cast<std::uint64_t>(__cvta_generic_to_shared(&b_s[0][0][0]));
  const std::uint64_t desc = ((addr & 0x3FFFF) >> 4) | (std::uint64_t((lbo >> 4) & 0x3FFF) << 16) |
                             (std::uint64_t((sbo >> 4) & 0x3FFF) << 32);  // swizzle 0, base 0
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "%8, p, 1, 1, 0;\n}\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)  // 1: D = A·B + D
      : "memory");
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  float* out = d + std::size_t(blockIdx.x) * MmaTile::kM * MmaTile::kN;
  out[r0 * MmaTile::kN + c0] = c[0];
  out[r0 * MmaTile::kN + c0 + 1] = c[1];
  out[r1 * MmaTile::kN + c0] = c[2];
  out[r1 * MmaTile::kN + c0 + 1] = c[3];
#else
  (void)tiles;
  (void)d;
  (void)lbo;
  (void)sbo;
#endif
}

__global__ void wgmma_built_kernel(int* built) {
#ifdef KVLAYER_WGMMA_PROBE
  *built = 1;
#else
  *built = 0;
#endif
}

}  // namespace

cudaError_t launch_wgmma_built(int* built, cudaStream_t stream) {
  wgmma_built_kernel<<<1, 1, 0, stream>>>(built);
  return cudaGetLastError();
}

cudaError_t launch_mma_probe(MmaEngine engine, const MmaTile* tiles, int n, float* d, int lbo,
                             int sbo, cudaStream_t stream) {
  if (n < 1) return cudaErrorInvalidValue;
  if (engine == MmaEngine::mma_sync)
    mma_sync_probe_kernel<<<n, 128, 0, stream>>>(tiles, d);
  else
    wgmma_probe_kernel<<<n, 128, 0, stream>>>(tiles, d, lbo, sbo);
  return cudaGetLastError();
}

}  // namespace kvlayer::cli
