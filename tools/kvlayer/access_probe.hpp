// Device side of `kvlayer probe`: the bytes a decode_dc of 8 KV heads × head dim 128 reads,
// read by different load patterns with no attention arithmetic (bench/NOTES.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

namespace kvlayer::cli {

/// How a probe kernel walks the token-major planes (136 B of K and 96 B of V per head per row).
enum class ProbePattern {
  direct,            ///< decode_mma_direct's per-lane 8-byte loads; block = (split, KV head)
  direct_colocated,  ///< the same loads; block = 4 KV heads of one split, one warp per head
  head_windows,  ///< a head's rows as 16-byte aligned windows (144 B K, 96 B V); block = (split,
                 ///< head)
  head_windows_colocated,  ///< head_windows with block = 4 KV heads of one split
  four_head_rows,  ///< block = 4 KV heads; warps read the heads' contiguous 544 + 384 B per row
  all_head_rows,   ///< block = all 8 KV heads; warps read whole 1088 + 768 B rows
  /// Block = all 8 KV heads of 1/(SMs·k) of the keys; a producer warp bulk-copies whole rows
  /// (one copy per row and plane) into a ring of stages, 8 consumer warps (one per head) read
  /// their head's bytes from shared memory as decode_mma_direct reads them from global.
  bulk_rows_16x4,      ///< 16-row stages, 4 of them, 1 block per SM
  bulk_rows_16x3_2sm,  ///< 16-row stages, 3 of them, 2 blocks per SM
  bulk_rows_32x3,      ///< 32-row stages, 3 of them, 1 block per SM
  bulk_rows_16x6,      ///< 16-row stages, 6 of them, 1 block per SM
  /// Block = 4 KV heads of a split (as four_head_rows); all 128 threads copy 16-row tiles of the
  /// heads' contiguous 544 + 384 B with 16-byte cp.async into a ring of stages; each warp then
  /// reads its head's bytes from shared memory as decode_mma_direct reads them from global.
  cp_async_rows_3,  ///< 3 stages
  cp_async_rows_4,  ///< 4 stages
};
inline constexpr ProbePattern kProbePatterns[] = {
    ProbePattern::direct,          ProbePattern::direct_colocated,
    ProbePattern::head_windows,    ProbePattern::head_windows_colocated,
    ProbePattern::four_head_rows,  ProbePattern::all_head_rows,
    ProbePattern::bulk_rows_16x4,  ProbePattern::bulk_rows_16x3_2sm,
    ProbePattern::bulk_rows_32x3,  ProbePattern::bulk_rows_16x6,
    ProbePattern::cp_async_rows_3, ProbePattern::cp_async_rows_4};

/// The pattern's name as the probe prints it.
std::string_view probe_pattern_name(ProbePattern p);

/// Planes of `keys` rows (a multiple of 16) for 8 KV heads × 128: K 1088 B, V 768 B per row.
struct ProbePlanes {
  const std::uint8_t* k = nullptr;
  const std::uint8_t* v = nullptr;
  long long keys = 0;
};

/// Reads every byte of `planes` once (plus each pattern's own overfetch) with `splits` splits
/// per KV head, as the decode's split kernel would, 128 threads per block; `sink` keeps the
/// loads live (one word per block, written practically never).
cudaError_t launch_access_probe(ProbePattern pattern, const ProbePlanes& planes, int splits,
                                unsigned* sink, cudaStream_t stream);

}  // namespace kvlayer::cli
