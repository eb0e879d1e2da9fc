// plan_decode: the fixed split-K grid of a layer (pure host arithmetic).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "decode/decode.hpp"
#include "decode/partition.hpp"
#include "kvlayer/accuracy.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/error.hpp"

namespace kvlayer::cuda::detail {

DecodePlan plan_decode(int n_kv_heads, int head_dim, int gqa, std::int64_t max_view_keys,
                       int multiprocessor_count, DecodeKernel kernel, int split_balance) {
  DecodeOptions options;
  // An unknown kernel value stays unknown (refused below), rather than mapped to one.
  options.kernel = kernel == DecodeKernel::mma         ? DecodeOptions::Kernel::mma
                   : kernel == DecodeKernel::cuda_core ? DecodeOptions::Kernel::cuda_core
                                                       : DecodeOptions::Kernel(0xff);
  options.split_balance = split_balance;
  return plan_decode(n_kv_heads, head_dim, gqa, max_view_keys, multiprocessor_count, options);
}

DecodePlan plan_decode(int n_kv_heads, int head_dim, int gqa, std::int64_t max_view_keys,
                       int multiprocessor_count, const DecodeOptions& options) {
  const char* op = "plan_decode";
  if (!head_dim_supported(head_dim))
    refuse(op, "head_dim ", head_dim,
           " is not supported by the CUDA decode (supported: ", supported_head_dims(), ")");
  if (gqa < 1 || gqa > kMaxGqa)
    refuse(op, "gqa ", gqa, " is not supported by the CUDA decode (supported: 1..", kMaxGqa, ")");
  if (n_kv_heads < 1 || n_kv_heads > kMaxKvHeads)
    refuse(op, "n_kv_heads ", n_kv_heads, " is outside the supported range [1, ", kMaxKvHeads, "]");
  if (max_view_keys < 1 || max_view_keys > std::numeric_limits<std::int32_t>::max())
    refuse(op, "max_view_keys ", max_view_keys, " is outside [1, 2^31 - 1]");
  if (multiprocessor_count < 1)
    refuse(op, "multiprocessor_count ", multiprocessor_count, " must be at least 1");
  if (options.split_balance < 0 || options.split_balance > DecodeOptions::kMaxSplitBalance)
    refuse(op, "split_balance ", options.split_balance, " is outside [0, ",
           DecodeOptions::kMaxSplitBalance, "]");
  if (options.batch_waves < 1 || options.batch_waves > DecodeOptions::kMaxBatchWaves)
    refuse(op, "batch_waves ", options.batch_waves, " is outside [1, ",
           DecodeOptions::kMaxBatchWaves, "]");
  if (options.max_verify_splits < 0 || options.max_verify_splits > kDecodeMaxSplits)
    refuse(op, "max_verify_splits ", options.max_verify_splits, " is outside [0, ",
           kDecodeMaxSplits, "] (0: no cap)");
  if (options.kernel != DecodeOptions::Kernel::cuda_core &&
      options.kernel != DecodeOptions::Kernel::mma)
    refuse(op, "decode kernel ", int(options.kernel),
           " is not a kernel (supported: cuda_core, mma)");
  if (options.rows != DecodeOptions::Rows::automatic &&
      options.rows != DecodeOptions::Rows::split && options.rows != DecodeOptions::Rows::whole)
    refuse(op, "row choice ", int(options.rows), " is not one (supported: auto, split, whole)");

  DecodePlan p;
  p.n_kv_heads = n_kv_heads;
  p.head_dim = head_dim;
  p.gqa = gqa;
  p.max_view_keys = max_view_keys;
  p.kernel = options.kernel == DecodeOptions::Kernel::cuda_core ? DecodeKernel::cuda_core
                                                                : DecodeKernel::mma;
  const bool mma = p.kernel == DecodeKernel::mma;
  p.tile_keys = mma ? kDecodeMmaTileKeys : decode_tile_keys(head_dim);
  p.split_balance = options.split_balance;
  p.max_verify_splits = options.max_verify_splits;
  // No more splits than the longest view fills (a shorter view leaves some of them empty), and
  // none shorter than one tile (it would only add merge work).
  const std::int64_t longest =
      decode_keys_per_split(max_view_keys, 1 << 30, p.tile_keys, p.split_balance);
  const std::int64_t max_splits =
      std::min({(max_view_keys + longest - 1) / longest,
                (max_view_keys + p.tile_keys - 1) / p.tile_keys, std::int64_t(kDecodeMaxSplits)});
  // gqa > 8 on tensor cores: one 16-row block per (KV head, split) at 2 per SM, unless the
  // longest view's splits fill less than 3/4 of those resident slots; then two blocks of ≤ 8
  // rows (row_chunks), at 3 per SM at head dim 128, the second reading the keys from L2.
  // Below 3/4 the extra blocks fill idle slots; above it they only add a second pass over the
  // keys (bench/NOTES.md).
  // Only the direct kernel's instances take 8 of 16 rows (not the staged kernel of head dim 64).
  const bool rows_can_split = mma && gqa > 8 && head_dim != 64;
  const std::int64_t slots =
      std::int64_t(decode_mma_blocks_per_sm(head_dim, 16)) * multiprocessor_count;
  p.split_rows = rows_can_split && 4 * n_kv_heads * max_splits < 3 * slots;
  if (options.rows != DecodeOptions::Rows::automatic)
    p.split_rows = rows_can_split && options.rows == DecodeOptions::Rows::split;
  // Enough (KV head, split, row block) blocks to fill every SM at the longest view (as many as
  // stay resident).
  const SplitChoice choice = select_split_kernel(p, 0);
  const int per_sm = split_blocks_per_sm(choice.kernel, head_dim, choice.rows);
  const std::int64_t target = std::int64_t(per_sm) * multiprocessor_count / row_chunks(p, 0);
  // NOTE: rounded down: one block more than the resident slots would start a second wave that
  // runs a whole split's time alone (8 × 128 at 3 per SM: 50 splits = 400 blocks > 396).
  const std::int64_t splits = std::clamp<std::int64_t>(target / n_kv_heads, 1, max_splits);
  p.n_splits = int(splits);
  p.batch_waves = options.batch_waves;
  p.batch_items = std::max<std::int64_t>(1, options.batch_waves * target / n_kv_heads);
  // keys_per_split grows with the view length, so the longest view bounds every launch.
  p.max_keys_per_split =
      decode_keys_per_split(max_view_keys, p.n_splits, p.tile_keys, p.split_balance);
  // One rescale per tile of an accumulator's chain; the mma kernel's warps each see every 4th
  // 16-key tile (max_keys_per_split / 64 of them) and the block merges its 4 warps once more.
  p.max_rescales =
      mma ? p.max_keys_per_split / kDecodeMmaTileKeys + 1 : p.max_keys_per_split / p.tile_keys;
  p.pv_mma_steps = mma ? p.max_keys_per_split / kDecodeMmaTileKeys : 0;
  // Per (KV head, split, query head): o[head_dim], m, l — all f32.
  p.scratch_bytes = std::size_t(n_kv_heads) * std::size_t(p.n_splits) * std::size_t(gqa) *
                    std::size_t(head_dim + 2) * sizeof(float);
  return p;
}

void plan_verify(DecodePlan& plan, int max_verify, std::int64_t verify_max_view_keys,
                 int multiprocessor_count, bool wgmma) {
  const char* op = "plan_verify";
  if (max_verify < 1 || max_verify > kMaxVerify)
    refuse(op, "max_verify ", max_verify, " is outside the supported range [1, ", kMaxVerify, "]");
  if (verify_max_view_keys < 1 || verify_max_view_keys > std::numeric_limits<std::int32_t>::max())
    refuse(op, "verify_max_view_keys ", verify_max_view_keys, " is outside [1, 2^31 - 1]");
  plan.max_verify = max_verify;
  plan.wgmma_verify = wgmma;
  plan.verify_max_view_keys = verify_max_view_keys;
  plan.verify_multiprocessors = std::max(multiprocessor_count, 1);
  for (int t = 1; t <= max_verify; ++t) {
    const std::size_t rows = std::size_t(t) * std::size_t(plan.gqa);
    const std::size_t bytes = std::size_t(plan.n_kv_heads) * std::size_t(verify_splits(plan, t)) *
                              rows * std::size_t(plan.head_dim + 2) * sizeof(float);
    plan.scratch_bytes = std::max(plan.scratch_bytes, bytes);
  }
}

std::int64_t verify_wave_blocks(const DecodePlan& plan, int T) {
  const SplitChoice choice = select_split_kernel(plan, T <= 1 ? 1 : T);
  return std::int64_t(split_blocks_per_sm(choice.kernel, plan.head_dim, choice.rows)) *
         plan.verify_multiprocessors;
}

int row_chunks(const DecodePlan& plan, int T) {
  const int rows = T > 1 ? T * plan.gqa : plan.gqa;
  const int per_block = select_split_kernel(plan, T).rows;
  return (rows + per_block - 1) / per_block;
}

namespace {

/// A verify of T queries: the blocks of one resident wave per KV head and row block.
std::int64_t verify_wave_blocks_per_row_block(const DecodePlan& plan, int T) {
  return verify_wave_blocks(plan, T) / (std::int64_t(plan.n_kv_heads) * row_chunks(plan, T));
}

}  // namespace

int verify_splits(const DecodePlan& plan, int T) {
  // As plan_decode: one resident wave of blocks, shared by the row blocks, no split shorter
  // than a tile.
  const std::int64_t max_tiles =
      (plan.verify_max_view_keys + kDecodeMmaTileKeys - 1) / kDecodeMmaTileKeys;
  const std::int64_t splits = verify_wave_blocks_per_row_block(plan, T);
  std::int64_t most = std::min<std::int64_t>(max_tiles, kDecodeMaxSplits);
  if (plan.max_verify_splits > 0) most = std::min<std::int64_t>(most, plan.max_verify_splits);
  return int(std::clamp<std::int64_t>(splits, 1, most));
}

SplitChoice select_split_kernel(const DecodePlan& plan, int queries) {
  if (queries >= 2) {
    // T·gqa ≤ 16 at head dim 128: the decode's register-direct kernel takes the rows on its
    // n-tiles (each tile converted once, in registers; the verify kernel's shared-memory stage
    // costs more than it shares at so few rows).
    // More rows at head dim 128, where the plan allows warpgroup MMA (opt-in: the layer's
    // DecodeOptions::Verify::wgmma on a device that has it): the wgmma kernel, 64 rows
    // per block (one warpgroup) up to 64, else 128 (two warpgroups sharing each tile's
    // conversion).
    const int rows = queries * plan.gqa;
    if (plan.head_dim == 128 && rows <= 16)
      return {SplitKernel::mma_direct_verify, rows <= 8 ? 8 : 16};
    if (plan.head_dim == 128 && plan.wgmma_verify)
      return {SplitKernel::wgmma_verify,
              rows <= kWgmmaVerifyRows ? kWgmmaVerifyRows : 2 * kWgmmaVerifyRows};
    if (plan.head_dim == 128 || plan.head_dim == 256)
      return {SplitKernel::mma_verify,
              verify_group_rows(plan.head_dim) * verify_row_groups(plan.head_dim, rows)};
    return {SplitKernel::mma_verify_staged, kVerifyRowsPerBlock};
  }
  if (plan.kernel == DecodeKernel::cuda_core && queries == 0) {
    int rows = 1;
    while (rows < plan.gqa) rows *= 2;
    return {SplitKernel::cuda_core, rows};
  }
  const int rows = plan.gqa <= 8 || plan.split_rows ? 8 : 16;
  if (plan.head_dim == 128) return {SplitKernel::mma_direct, rows};
  if (plan.head_dim == 256 && rows == 8 && !plan.batch) return {SplitKernel::mma_bulk, rows};
  if (plan.head_dim == 256) return {SplitKernel::mma_staged, 16};
  return {SplitKernel::mma_staged, rows};
}

SplitGrid split_grid(const DecodePlan& plan, int T) {
  const bool verify = T > 0;
  const SplitChoice choice = select_split_kernel(plan, T);
  SplitGrid g;
  g.n_splits = verify ? verify_splits(plan, T) : plan.n_splits;
  g.granule = split_granule(choice.kernel, plan.head_dim);
  g.balance = verify ? 0 : plan.split_balance;
  return g;
}

LaunchShape launch_shape(const DecodePlan& plan, int T, std::int64_t view_keys) {
  LaunchShape s;
  s.choice = select_split_kernel(plan, T);
  s.row_blocks = row_chunks(plan, T);
  s.grid = split_grid(plan, T);
  if (view_keys <= 0) return s;
  s.keys_per_split =
      decode_keys_per_split(view_keys, s.grid.n_splits, s.grid.granule, s.grid.balance);
  s.active_splits = int((view_keys + s.keys_per_split - 1) / s.keys_per_split);
  // The key loop's step per warp: the tensor-core decode kernels' warps each take every 4th
  // 16-key tile (64 keys a trip), the verify kernel's warps every block tile together, the
  // CUDA-core kernel one tile per trip.
  switch (s.choice.kernel) {
    case SplitKernel::cuda_core:
      s.loop_keys = plan.tile_keys;
      break;
    case SplitKernel::mma_verify:
      s.loop_keys = verify_tile_keys(plan.head_dim);
      break;
    case SplitKernel::wgmma_verify:
      s.loop_keys = kWgmmaVerifyTileKeys;
      break;
    default:
      s.loop_keys = kDecodeMmaTileKeys;
  }
  const std::int64_t longest = std::min(view_keys, s.keys_per_split);
  s.loop_trips = (longest + s.loop_keys - 1) / s.loop_keys;
  return s;
}

const char* split_kernel_name(SplitKernel kernel) {
  switch (kernel) {
    case SplitKernel::cuda_core:
      return "cuda_core";
    case SplitKernel::mma_direct:
      return "mma_direct";
    case SplitKernel::mma_bulk:
      return "mma_bulk";
    case SplitKernel::mma_staged:
      return "mma_staged";
    case SplitKernel::mma_verify:
      return "mma_verify";
    case SplitKernel::mma_direct_verify:
      return "mma_direct_verify";
    case SplitKernel::mma_verify_staged:
      return "mma_verify_staged";
    case SplitKernel::wgmma_verify:
      return "wgmma_verify";
  }
  return "?";
}

namespace {

/// A verify row's accumulation shape for splits of kps keys (at most `splits` of them).
kvlayer::AccumulationShape verify_shape(const DecodePlan& plan, int T, std::int64_t kps,
                                        int splits) {
  // T = 1, the direct and the staged verify (as plan_decode's mma kernels): a warp sees every
  // 4th 16-key tile of 64 keys, one mma step and one max update each, K quants exact.
  // decode_mma_verify.cu: per tile of verify_tile_keys a warp takes verify_warp_mtiles m-tiles (one
  // mma step each) in verify_softmax_steps max updates.
  // decode_wgmma_verify.cu: per 64-key tile one max update and 4 k16 steps of P·V; a row lives
  // in one warp (no merge of warps), K̃ = fp16(d·q).
  const SplitChoice choice = select_split_kernel(plan, T);
  std::int64_t tile = kDecodeMmaTileKeys, steps_per_tile = 1, updates_per_tile = 1, merges = 1;
  if (choice.kernel == SplitKernel::mma_verify) {
    tile = verify_tile_keys(plan.head_dim);
    steps_per_tile = verify_warp_mtiles(plan.head_dim, T * plan.gqa);
    updates_per_tile = verify_softmax_steps(plan.head_dim, T * plan.gqa);
  }
  if (choice.kernel == SplitKernel::wgmma_verify) {
    tile = kWgmmaVerifyTileKeys;
    steps_per_tile = kWgmmaVerifyTileKeys / 16;
    merges = 0;
  }
  const std::int64_t tiles = kps / tile;
  kvlayer::AccumulationShape shape;
  shape.max_keys_per_split = kps;
  shape.n_splits = splits;
  shape.rescales = tiles * updates_per_tile + merges;  // + the block's merge of its warps
  shape.tensor_core = true;
  shape.pv_mma_steps = tiles * steps_per_tile;
  shape.k_fused_f16 = (choice.kernel == SplitKernel::mma_verify && verify_folds_k(plan.head_dim)) ||
                      choice.kernel == SplitKernel::wgmma_verify;
  return shape;
}

/// A decode's accumulation shape for splits of kps keys (at most `splits` of them).
kvlayer::AccumulationShape decode_shape(const DecodePlan& plan, std::int64_t kps, int splits) {
  const bool mma = plan.kernel == DecodeKernel::mma;
  kvlayer::AccumulationShape shape;
  shape.max_keys_per_split = kps;
  shape.n_splits = splits;
  shape.rescales = mma ? kps / kDecodeMmaTileKeys + 1 : kps / plan.tile_keys;
  shape.tensor_core = mma;
  shape.pv_mma_steps = mma ? kps / kDecodeMmaTileKeys : 0;
  return shape;
}

}  // namespace

kvlayer::AccumulationShape verify_accumulation_shape(const DecodePlan& plan, int T) {
  const int splits = verify_splits(plan, T);
  const std::int64_t kps =
      decode_keys_per_split(plan.verify_max_view_keys, splits, kDecodeMmaTileKeys, 0);
  return verify_shape(plan, T, kps, splits);
}

std::int64_t batch_items(const DecodePlan& plan, int T) {
  if (T <= 1) return plan.batch_items;
  return std::max<std::int64_t>(1, plan.batch_waves * verify_wave_blocks_per_row_block(plan, T));
}

std::int64_t batch_max_items(const DecodePlan& plan, int max_batch) {
  std::int64_t most = batch_items(plan, 0);
  for (int t = 2; t <= plan.max_verify; ++t) most = std::max(most, batch_items(plan, t));
  return most + max_batch;
}

std::vector<kvlayer::AccumulationShape> batch_shapes(const DecodePlan& plan, int T,
                                                     std::span<const std::int64_t> view_keys) {
  const int q = T <= 1 ? 0 : T;  // T = 1: the decode's grid
  const SplitGrid grid = split_grid(plan, q);
  std::int64_t total = 0;
  for (const std::int64_t n : view_keys) total += std::max<std::int64_t>(n, 0);
  const std::int64_t chunk = batch_chunk(total, batch_items(plan, q), grid.balance, grid.granule);
  std::vector<kvlayer::AccumulationShape> shapes;
  for (const std::int64_t n : view_keys) {
    // plan_batch_splits gives the same splits.
    const BatchSplits b = batch_splits(n, chunk, grid.n_splits, grid.granule);
    if (b.splits == 0) {  // no keys: nothing accumulates
      shapes.push_back(q == 0 ? accumulation_shape(plan) : verify_accumulation_shape(plan, q));
      continue;
    }
    shapes.push_back(q == 0 ? decode_shape(plan, b.keys_per_split, b.splits)
                            : verify_shape(plan, q, b.keys_per_split, b.splits));
  }
  return shapes;
}

kvlayer::AccumulationShape accumulation_shape(const DecodePlan& plan) {
  kvlayer::AccumulationShape shape;
  shape.max_keys_per_split = plan.max_keys_per_split;
  shape.n_splits = plan.n_splits;
  shape.rescales = plan.max_rescales;
  shape.tensor_core = plan.kernel == DecodeKernel::mma;
  shape.pv_mma_steps = plan.pv_mma_steps;
  return shape;
}

}  // namespace kvlayer::cuda::detail
