// Access-pattern kernels of `kvlayer probe` (access_probe.hpp). Each reads the planes of a
// decode_dc (8 KV heads × 128, token-major rows) with one load pattern, two tiles in flight per
// warp as in decode_mma_direct.cu, and XORs the words: the time is the pattern's memory cost.
#include <cstdint>

#include "access_probe.hpp"
#include "bulk_copy.cuh"
#include "cp_async.cuh"

namespace kvlayer::cli {
namespace {

constexpr int kHeads = 8;
constexpr int kKHead = 136, kVHead = 96;  // bytes of one head in a row
constexpr int kKRow = kHeads * kKHead, kVRow = kHeads * kVHead;
constexpr int kWarps = 4, kThreads = 32 * kWarps;

/// Keys [lo, hi) of split s of n (bounds on 16-key granules).
__device__ void split_keys(long long keys, int n, int s, long long& lo, long long& hi) {
  lo = (keys * s / n) & ~15LL;
  hi = s == n - 1 ? keys : (keys * (s + 1) / n) & ~15LL;
}

/// Keeps `acc` live through a shared-memory round trip the size of the decode's merge staging
/// (the decode kernel's shared-memory footprint, so the L1 carve-out matches).
__device__ void publish(unsigned acc, unsigned* sink) {
  __shared__ unsigned stage[kWarps * kHeads * 132];
  for (int i = threadIdx.x; i < kWarps * kHeads * 132; i += kThreads) stage[i] = acc + i;
  __syncthreads();
  acc ^= stage[(threadIdx.x * 37) % (kWarps * kHeads * 132)];
  if (acc == 0x9E3779B9u) sink[blockIdx.y * gridDim.x + blockIdx.x] = acc;
}

/// Consumes tiles first, first + step, … below `tiles` with the next tile's loads in flight
/// while the current one is consumed: decode_mma_direct.cu's two register buffers.
template <typename Tile, typename Load, typename Consume>
__device__ __forceinline__ void walk_two_ahead(int first, int tiles, int step, Tile& b0, Tile& b1,
                                               const Load& load, const Consume& consume) {
  if (first < tiles) load(b0, first);
  for (int i = first; i < tiles; i += 2 * step) {
    if (i + step < tiles) load(b1, i + step);
    consume(b0);
    if (i + step < tiles) {
      if (i + 2 * step < tiles) load(b0, i + 2 * step);
      consume(b1);
    }
  }
}

__device__ __forceinline__ uint2 ld8(const std::uint8_t* p) {
  return __ldg(reinterpret_cast<const uint2*>(p));
}
__device__ __forceinline__ uint4 ld16(const std::uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

/// decode_mma_direct.cu's loads of one 16-key tile: K rows g, g + 8 (8-byte words t, t+4, t+8,
/// t+12, and 16 for t = 0), V rows 2t, 2t+1, 2t+8, 2t+9 (header and 8 qs bytes of block g / 2).
struct DirectTile {
  uint2 k[2][5], vh[4], vq[4];
};

template <bool kColocated>
__global__ void __launch_bounds__(kThreads)
    direct_probe_kernel(ProbePlanes pl, int splits, unsigned* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int head = kColocated ? 4 * blockIdx.y + warp : blockIdx.y;
  long long lo, hi;
  split_keys(pl.keys, kColocated ? 4 * splits : splits, blockIdx.x, lo, hi);
  const int first = kColocated ? 0 : warp, step = kColocated ? 1 : kWarps;
  const int tiles = static_cast<int>((hi - lo) / 16);
  const std::uint8_t* k_head = pl.k + head * kKHead + 8 * t;
  const std::uint8_t* v_head = pl.v + head * kVHead + 24 * (g >> 1);
  auto load = [&](DirectTile& r, int i) {
    const long long row0 = lo + 16LL * i;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const std::uint8_t* src = k_head + (row0 + g + 8 * j) * kKRow;
#pragma unroll
      for (int w = 0; w < 4; ++w) r.k[j][w] = ld8(src + 32 * w);
      r.k[j][4] = t == 0 ? ld8(src + 128) : make_uint2(0u, 0u);
    }
    const int v_key[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::uint8_t* src = v_head + (row0 + v_key[j]) * kVRow;
      r.vh[j] = ld8(src);
      r.vq[j] = ld8(src + 8 + 8 * (g & 1));
    }
  };
  unsigned acc = 0;
  auto consume = [&](const DirectTile& r) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int w = 0; w < 5; ++w) acc ^= r.k[j][w].x ^ r.k[j][w].y;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= r.vh[j].x ^ r.vh[j].y ^ r.vq[j].x ^ r.vq[j].y;
  };
  DirectTile b0, b1;
  walk_two_ahead(first, tiles, step, b0, b1, load, consume);
  publish(acc, sink);
}

/// Window patterns: per warp tile, kRows rows of a K byte window and a V byte window, read as
/// 16-byte chunks spread over the lanes.
template <ProbePattern P>
struct Windows {
  static constexpr bool kHeadWise =
      P == ProbePattern::head_windows || P == ProbePattern::head_windows_colocated;
  static constexpr int kRows = kHeadWise ? 16 : P == ProbePattern::four_head_rows ? 4 : 2;
  static constexpr int kKChunks = kHeadWise ? 9 : P == ProbePattern::four_head_rows ? 34 : 68;
  static constexpr int kVChunks = kHeadWise ? 6 : P == ProbePattern::four_head_rows ? 24 : 48;
  static constexpr int kChunks = kRows * (kKChunks + kVChunks);
  static constexpr int kPerLane = (kChunks + 31) / 32;
  /// Splits of the key range, relative to the decode's per-head split count.
  static constexpr int kSplitFactor = P == ProbePattern::head_windows    ? 1
                                      : P == ProbePattern::all_head_rows ? 8
                                                                         : 4;
};

template <ProbePattern P>
__global__ void __launch_bounds__(kThreads)
    window_probe_kernel(ProbePlanes pl, int splits, unsigned* sink) {
  using W = Windows<P>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  long long lo, hi;
  split_keys(pl.keys, W::kSplitFactor * splits, blockIdx.x, lo, hi);
  int k_base = 0, v_base = 0, first = warp, step = kWarps;
  if constexpr (P == ProbePattern::head_windows) {
    k_base = (blockIdx.y * kKHead) & ~15;
    v_base = blockIdx.y * kVHead;
  } else if constexpr (P == ProbePattern::head_windows_colocated) {
    const int head = 4 * blockIdx.y + warp;
    k_base = (head * kKHead) & ~15;
    v_base = head * kVHead;
    first = 0;
    step = 1;
  } else if constexpr (P == ProbePattern::four_head_rows) {
    k_base = blockIdx.y * 4 * kKHead;
    v_base = blockIdx.y * 4 * kVHead;
  }
  const int tiles = static_cast<int>((hi - lo) / W::kRows);
  // Each lane's chunks: byte offset within the tile's rows, and which plane.
  unsigned off[W::kPerLane];
  bool is_v[W::kPerLane], live[W::kPerLane];
#pragma unroll
  for (int j = 0; j < W::kPerLane; ++j) {
    const int c = lane + 32 * j;
    live[j] = c < W::kChunks;
    is_v[j] = c >= W::kRows * W::kKChunks;
    const int cv = c - W::kRows * W::kKChunks;
    off[j] = is_v[j] ? unsigned((cv / W::kVChunks) * kVRow + v_base + 16 * (cv % W::kVChunks))
                     : unsigned((c / W::kKChunks) * kKRow + k_base + 16 * (c % W::kKChunks));
  }
  auto load = [&](uint4(&r)[W::kPerLane], int i) {
    const long long row0 = lo + (long long)W::kRows * i;
    const std::uint8_t* k_tile = pl.k + row0 * kKRow;
    const std::uint8_t* v_tile = pl.v + row0 * kVRow;
#pragma unroll
    for (int j = 0; j < W::kPerLane; ++j)
      r[j] = live[j] ? ld16((is_v[j] ? v_tile : k_tile) + off[j]) : make_uint4(0u, 0u, 0u, 0u);
  };
  unsigned acc = 0;
  auto consume = [&](const uint4(&r)[W::kPerLane]) {
#pragma unroll
    for (int j = 0; j < W::kPerLane; ++j) acc ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
  };
  uint4 b0[W::kPerLane], b1[W::kPerLane];
  walk_two_ahead(first, tiles, step, b0, b1, load, consume);
  publish(acc, sink);
}

template <ProbePattern P>
cudaError_t launch_windows(const ProbePlanes& pl, int splits, unsigned* sink, cudaStream_t s) {
  using W = Windows<P>;
  const int groups = P == ProbePattern::head_windows    ? kHeads
                     : P == ProbePattern::all_head_rows ? 1
                                                        : 2;
  window_probe_kernel<P>
      <<<dim3(W::kSplitFactor * splits, groups), kThreads, 0, s>>>(pl, splits, sink);
  return cudaGetLastError();
}

/// XOR of one KV head's bytes of a 16-key tile in a shared-memory stage, read as
/// decode_mma_direct.cu reads them from global memory: K rows g, g + 8 (8-byte words t, t+4,
/// t+8, t+12, and 16 for t = 0), V rows 2t, 2t+1, 2t+8, 2t+9 (header and 8 qs bytes of block
/// g / 2). k_head / v_head: the head's bytes in the tile's first K / V row; strides in bytes.
__device__ __forceinline__ unsigned xor_stage_tile(const std::uint8_t* k_head, int k_stride,
                                                   const std::uint8_t* v_head, int v_stride,
                                                   int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int v_key[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
  unsigned acc = 0;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const std::uint8_t* src = k_head + (g + 8 * j) * k_stride + 8 * t;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint2 x = *reinterpret_cast<const uint2*>(src + 32 * w);
      acc ^= x.x ^ x.y;
    }
    if (t == 0) {
      const uint2 x = *reinterpret_cast<const uint2*>(src + 128);
      acc ^= x.x ^ x.y;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const std::uint8_t* src = v_head + v_key[j] * v_stride + 24 * (g >> 1);
    const uint2 h = *reinterpret_cast<const uint2*>(src);
    const uint2 q = *reinterpret_cast<const uint2*>(src + 8 + 8 * (g & 1));
    acc ^= h.x ^ h.y ^ q.x ^ q.y;
  }
  return acc;
}

/// Bulk-row pipeline (ProbePattern::bulk_rows_*): shared-memory row strides padded so that the
/// consumers' 8-byte reads of one head are conflict-free (K 1104 B, V 784 B).
constexpr int kKStageRow = kKRow + 16, kVStageRow = kVRow + 16;

template <int kRows, int kStages>
constexpr int bulk_smem_bytes() {
  return kStages * kRows * (kKStageRow + kVStageRow) + 2 * kStages * 8;
}

template <int kRows, int kStages>
__global__ void __launch_bounds__(32 * (kHeads + 1))
    bulk_probe_kernel(ProbePlanes pl, unsigned* sink) {
  extern __shared__ __align__(16) std::uint8_t smem[];
  constexpr int kStageBytes = kRows * (kKStageRow + kVStageRow);
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kStages * kStageBytes);
  std::uint64_t* empty = full + kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      cuda::detail::mbarrier_init(&full[st], 1);
      cuda::detail::mbarrier_init(&empty[st], kHeads);
    }
  }
  __syncthreads();
  long long lo = (pl.keys * blockIdx.x / gridDim.x) & ~15LL;
  long long hi =
      blockIdx.x == gridDim.x - 1 ? pl.keys : (pl.keys * (blockIdx.x + 1) / gridDim.x) & ~15LL;
  const int tiles = static_cast<int>((hi - lo + kRows - 1) / kRows);
  unsigned acc = 0;
  if (warp == kHeads) {  // producer
    for (int i = 0; i < tiles; ++i) {
      const int st = i % kStages;
      if (i >= kStages) cuda::detail::mbarrier_wait(&empty[st], ((i / kStages) + 1) & 1);
      const long long row0 = lo + (long long)kRows * i;
      const int rows = static_cast<int>(hi - row0 < kRows ? hi - row0 : kRows);
      if (lane == 0)
        cuda::detail::mbarrier_arrive_expect_tx(&full[st], unsigned(rows * (kKRow + kVRow)));
      __syncwarp();
      std::uint8_t* stage = smem + st * kStageBytes;
      for (int r = lane; r < 2 * rows; r += 32) {
        if (r < rows)
          cuda::detail::bulk_copy_to_shared(stage + r * kKStageRow, pl.k + (row0 + r) * kKRow,
                                            kKRow, &full[st]);
        else
          cuda::detail::bulk_copy_to_shared(stage + kRows * kKStageRow + (r - rows) * kVStageRow,
                                            pl.v + (row0 + r - rows) * kVRow, kVRow, &full[st]);
      }
    }
  } else {  // consumer: head `warp`
    for (int i = 0; i < tiles; ++i) {
      const int st = i % kStages;
      cuda::detail::mbarrier_wait(&full[st], (i / kStages) & 1);
      const std::uint8_t* stage = smem + st * kStageBytes;
#pragma unroll
      for (int sub = 0; sub < kRows / 16; ++sub)
        acc ^= xor_stage_tile(stage + 16 * sub * kKStageRow + warp * kKHead, kKStageRow,
                              stage + kRows * kKStageRow + 16 * sub * kVStageRow + warp * kVHead,
                              kVStageRow, lane);
      __syncwarp();
      if (lane == 0) cuda::detail::mbarrier_arrive(&empty[st]);
    }
  }
  if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;
}

template <int kRows, int kStages>
cudaError_t launch_bulk(const ProbePlanes& pl, int blocks_per_sm, unsigned* sink, cudaStream_t s) {
  constexpr int kSmem = bulk_smem_bytes<kRows, kStages>();
  cudaError_t e = cudaFuncSetAttribute(bulk_probe_kernel<kRows, kStages>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  int dev = 0, sms = 0;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
    return e;
  bulk_probe_kernel<kRows, kStages><<<sms * blocks_per_sm, 32 * (kHeads + 1), kSmem, s>>>(pl, sink);
  return cudaGetLastError();
}

/// cp.async pipeline (ProbePattern::cp_async_rows_*): 4 heads' bytes per row, rows padded by 16
/// bytes (K 560, V 400) so that each warp's 8-byte reads of its head are conflict-free.
constexpr int kGroupK = 4 * kKHead, kGroupV = 4 * kVHead;
constexpr int kGroupKStage = kGroupK + 16, kGroupVStage = kGroupV + 16;
constexpr int kTileRows = 16;
constexpr int kGroupStageBytes = kTileRows * (kGroupKStage + kGroupVStage);

template <int kStages>
__global__ void __launch_bounds__(kThreads)
    cp_async_probe_kernel(ProbePlanes pl, int splits, unsigned* sink) {
  extern __shared__ __align__(16) std::uint8_t smem[];
  constexpr int kKChunks = kGroupK / 16, kVChunks = kGroupV / 16;
  constexpr int kChunks = kTileRows * (kKChunks + kVChunks);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  long long lo, hi;
  split_keys(pl.keys, 4 * splits, blockIdx.x, lo, hi);
  const int tiles = static_cast<int>((hi - lo) / kTileRows);
  const std::uint8_t* k_group = pl.k + blockIdx.y * kGroupK;
  const std::uint8_t* v_group = pl.v + blockIdx.y * kGroupV;
  auto issue = [&](int i) {
    if (i < tiles) {
      std::uint8_t* stage = smem + (i % kStages) * kGroupStageBytes;
      const long long row0 = lo + (long long)kTileRows * i;
      for (int c = threadIdx.x; c < kChunks; c += kThreads) {
        if (c < kTileRows * kKChunks) {
          const int r = c / kKChunks, col = c % kKChunks;
          cuda::detail::cp_async<16>(stage + r * kGroupKStage + 16 * col,
                                     k_group + (row0 + r) * kKRow + 16 * col);
        } else {
          const int cv = c - kTileRows * kKChunks, r = cv / kVChunks, col = cv % kVChunks;
          cuda::detail::cp_async<16>(stage + kTileRows * kGroupKStage + r * kGroupVStage + 16 * col,
                                     v_group + (row0 + r) * kVRow + 16 * col);
        }
      }
    }
    cuda::detail::cp_async_commit();
  };
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  unsigned acc = 0;
  for (int i = 0; i < tiles; ++i) {
    cuda::detail::cp_async_wait<kStages - 2>();
    __syncthreads();
    issue(i + kStages - 1);
    const std::uint8_t* stage = smem + (i % kStages) * kGroupStageBytes;
    acc ^= xor_stage_tile(stage + warp * kKHead, kGroupKStage,
                          stage + kTileRows * kGroupKStage + warp * kVHead, kGroupVStage, lane);
  }
  cuda::detail::cp_async_wait<0>();
  if (acc == 0x9E3779B9u) sink[blockIdx.y * gridDim.x + blockIdx.x] = acc;
}

template <int kStages>
cudaError_t launch_cp_async(const ProbePlanes& pl, int splits, unsigned* sink, cudaStream_t s) {
  constexpr int kSmem = kStages * kGroupStageBytes;
  const cudaError_t e = cudaFuncSetAttribute(cp_async_probe_kernel<kStages>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  cp_async_probe_kernel<kStages><<<dim3(4 * splits, 2), kThreads, kSmem, s>>>(pl, splits, sink);
  return cudaGetLastError();
}

}  // namespace

std::string_view probe_pattern_name(ProbePattern p) {
  switch (p) {
    case ProbePattern::direct:
      return "direct";
    case ProbePattern::direct_colocated:
      return "direct_colocated";
    case ProbePattern::head_windows:
      return "head_windows";
    case ProbePattern::head_windows_colocated:
      return "head_windows_colocated";
    case ProbePattern::four_head_rows:
      return "four_head_rows";
    case ProbePattern::all_head_rows:
      return "all_head_rows";
    case ProbePattern::bulk_rows_16x4:
      return "bulk_rows_16x4";
    case ProbePattern::bulk_rows_16x3_2sm:
      return "bulk_rows_16x3_2sm";
    case ProbePattern::bulk_rows_32x3:
      return "bulk_rows_32x3";
    case ProbePattern::bulk_rows_16x6:
      return "bulk_rows_16x6";
    case ProbePattern::cp_async_rows_3:
      return "cp_async_rows_3";
    case ProbePattern::cp_async_rows_4:
      return "cp_async_rows_4";
  }
  return "?";
}

cudaError_t launch_access_probe(ProbePattern pattern, const ProbePlanes& pl, int splits,
                                unsigned* sink, cudaStream_t s) {
  switch (pattern) {
    case ProbePattern::direct:
      direct_probe_kernel<false><<<dim3(splits, kHeads), kThreads, 0, s>>>(pl, splits, sink);
      return cudaGetLastError();
    case ProbePattern::direct_colocated:
      direct_probe_kernel<true><<<dim3(4 * splits, 2), kThreads, 0, s>>>(pl, splits, sink);
      return cudaGetLastError();
    case ProbePattern::head_windows:
      return launch_windows<ProbePattern::head_windows>(pl, splits, sink, s);
    case ProbePattern::head_windows_colocated:
      return launch_windows<ProbePattern::head_windows_colocated>(pl, splits, sink, s);
    case ProbePattern::four_head_rows:
      return launch_windows<ProbePattern::four_head_rows>(pl, splits, sink, s);
    case ProbePattern::all_head_rows:
      return launch_windows<ProbePattern::all_head_rows>(pl, splits, sink, s);
    case ProbePattern::bulk_rows_16x4:
      return launch_bulk<16, 4>(pl, 1, sink, s);
    case ProbePattern::bulk_rows_16x3_2sm:
      return launch_bulk<16, 3>(pl, 2, sink, s);
    case ProbePattern::bulk_rows_32x3:
      return launch_bulk<32, 3>(pl, 1, sink, s);
    case ProbePattern::bulk_rows_16x6:
      return launch_bulk<16, 6>(pl, 1, sink, s);
    case ProbePattern::cp_async_rows_3:
      return launch_cp_async<3>(pl, splits, sink, s);
    case ProbePattern::cp_async_rows_4:
      return launch_cp_async<4>(pl, splits, sink, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvlayer::cli
