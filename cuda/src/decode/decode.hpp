// Interface between the KvLayer and the split-K flash-decoding kernel (cuda/src/decode/).
// Planning (grid size, scratch) is done once at layer construction; the launch reads the live
// view length from device memory (device-counter variants) or takes it by value (host-len).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../batch_slots.hpp"
#include "../device_status.cuh"
#include "batch_schedule.hpp"
#include "kvlayer/cuda/decode_options.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "partition.hpp"
#include "split_instances.hpp"

namespace kvlayer {
struct AccumulationShape;
}

namespace kvlayer::cuda::detail {

/// The implementation family a plan asks for (DecodeOptions::kernel): select_split_kernel turns
/// it into the kernel a launch runs.
enum class DecodeKernel {
  cuda_core,  ///< f32 FMAs on CUDA cores (decode_cuda_core.cu; a second implementation)
  mma,        ///< mma.sync m16n8k16 f16 × f16 → f32 on tensor cores (the default)
};

/// The partition granule of a kernel's splits (decode_keys_per_split's tile): the split kernel
/// cuts its view by it, and the launch hands the same value to the merge and to a batch's
/// schedule (split_grid), so that they cannot cut a view differently.
__host__ __device__ constexpr int split_granule(SplitKernel kernel, int head_dim) {
  return kernel == SplitKernel::cuda_core ? decode_tile_keys(head_dim) : kDecodeMmaTileKeys;
}

struct DecodePlan;

/// A launch's kernel and its compile-time shape.
struct SplitChoice {
  SplitKernel kernel = SplitKernel::mma_staged;
  /// Query rows the kernel is built for: cuda_core 1, 2, 4, 8, 16 (≥ gqa); mma and
  /// mma_direct_verify 8 or 16; mma_verify 16, 32 or 64 per block (verify_group_rows ·
  /// verify_row_groups).
  int rows = 16;
};

/// The one kernel chooser: the split kernel a decode (queries 0) or a verify decode of T =
/// queries runs under `plan`. A verify of one query is a decode (the decode's kernel, the §11
/// view checks); verify decodes run on tensor cores whatever plan.kernel says.
SplitChoice select_split_kernel(const DecodePlan& plan, int queries);

/// The kernel's name, for reports ("mma_direct", …).
const char* split_kernel_name(SplitKernel kernel);

/// Fixed at construction: the grid and the scratch it needs serve every view length up to
/// max_view_keys, so one captured graph stays valid for every token.
struct DecodePlan {
  int n_kv_heads = 0;
  int head_dim = 0;                ///< K and V head dim (equal; one of kSupportedHeadDims)
  int gqa = 0;                     ///< query heads per KV head (1..16)
  std::int64_t max_view_keys = 0;  ///< longest view the grid serves (capacity or window)
  int n_splits = 0;                ///< thread blocks per KV head along the keys
  int tile_keys = 0;               ///< keys per tile of the key loop (4096 / head_dim)
  /// decode_keys_per_split's balance: splits of at least split_balance·√n keys for a view of n
  /// (DecodeOptions::split_balance), so a short view takes fewer splits than the grid holds.
  int split_balance = 0;
  /// A batch's plan (SPEC §12): select_split_kernel gives head dim 256 by 8 rows to the staged
  /// kernel, whose sequences' planes need no per-plane tensor map.
  bool batch = false;
  /// Batch launches: the resident waves of split blocks a launch's schedule aims at
  /// (DecodeOptions::batch_waves; batch_items), and for a decode (T = 1) the items (blocks per
  /// KV head) they make.
  int batch_waves = 0;
  std::int64_t batch_items = 0;
  /// Verify decodes take at most this many splits (DecodeOptions::max_verify_splits; 0: no cap).
  int max_verify_splits = 0;
  /// gqa > 8: the query rows of a KV head run in two blocks of ≤ 8 rows (row_chunks) instead of
  /// one of 16, where one block per (KV head, split) would leave a quarter of the slots empty
  /// (DecodeOptions::rows forces either).
  bool split_rows = false;
  std::int64_t max_keys_per_split = 0;  ///< longest sequential accumulation (for the tolerance)
  std::size_t scratch_bytes = 0;        ///< partial outputs + (max, sum) per split
  DecodeKernel kernel = DecodeKernel::cuda_core;
  /// Online-softmax rescales of one accumulator at the longest split (for the tolerance's
  /// AccumulationShape::rescales): one per tile, plus (mma) the block's merge of its warps.
  std::int64_t max_rescales = 0;
  /// mma kernels: the longest chain of mma accumulations into one PV accumulator (a warp's
  /// 16-key tiles of the longest split); 0 for cuda_core.
  std::int64_t pv_mma_steps = 0;
  /// Verify decodes (SPEC §11, plan_verify): up to max_verify queries per launch, whose union
  /// of views spans at most verify_max_view_keys keys, on a device of verify_multiprocessors
  /// (verify_wave_blocks). 0: the plan serves no verify decode.
  int max_verify = 0;
  std::int64_t verify_max_view_keys = 0;
  int verify_multiprocessors = 0;
  /// Verify decodes of T·gqa > 16 at head dim 128 run on decode_wgmma_verify.cu (plan_verify's
  /// `wgmma`: the options ask for it, DecodeOptions::Verify::wgmma, and the device and the build
  /// have warpgroup MMA).
  bool wgmma_verify = false;
};

/// What the accuracy contract needs of a plan (kvlayer/accuracy.hpp, rounding points
/// (1)-(5)): every GPU comparison takes its bound's shape from here.
kvlayer::AccumulationShape accumulation_shape(const DecodePlan& plan);

/// Makes `plan` serve verify decodes of 1..max_verify queries (SPEC §11) whose views span up to
/// verify_max_view_keys keys, and grows its scratch to fit the largest. Verify decodes run on
/// the tensor-core split kernel (decode_mma_staged.cu) whatever plan.kernel says. Throws
/// kvlayer::Error (refused) for max_verify outside [1, kMaxVerify] or a view outside
/// [1, 2^31 − 1].
/// `wgmma`: verify decodes of T·gqa > 16 at head dim 128 may run on warpgroup MMA (true only
/// where wgmma_verify_supported says the device and the build have it).
void plan_verify(DecodePlan& plan, int max_verify, std::int64_t verify_max_view_keys,
                 int multiprocessor_count, bool wgmma = false);

/// Split blocks of the kernel a verify decode of T queries runs (T = 1: the decode's) that the
/// device holds at once (shared by a launch's row blocks): each T's grid fills its own wave.
std::int64_t verify_wave_blocks(const DecodePlan& plan, int T);

/// Row blocks per KV head (blockIdx.z) of a decode (T ≤ 1) or a verify decode of T queries:
/// its gqa or T·gqa query rows in blocks of select_split_kernel's rows, one when they fit one.
int row_chunks(const DecodePlan& plan, int T);

/// Splits along the keys of a verify decode of T queries.
int verify_splits(const DecodePlan& plan, int T);

/// The accumulation shape of a verify decode of T queries (each output row's bound, SPEC §11).
kvlayer::AccumulationShape verify_accumulation_shape(const DecodePlan& plan, int T);

/// The items (split blocks per KV head and row block) a batch launch's schedule aims at: the
/// plan's batch_waves resident waves of the kernel a decode (T ≤ 1) or a verify of T queries
/// runs.
std::int64_t batch_items(const DecodePlan& plan, int T);

/// Split blocks per KV head and row block a batch launch's grid holds at the most, over every
/// T the plan serves: the schedule's aim plus one per position (each active view rounds its
/// last split up).
std::int64_t batch_max_items(const DecodePlan& plan, int max_batch);

/// The accumulation shapes of a batch launch of T queries (T ≤ 1: a decode) whose active views
/// hold view_keys keys (list order; a verify's the union of its rows' views; 0 for an empty
/// view or one in error): the host twin of plan_batch_splits, so that each position's bound
/// has its own splits' shape.
std::vector<kvlayer::AccumulationShape> batch_shapes(const DecodePlan& plan, int T,
                                                     std::span<const std::int64_t> view_keys);

/// How a launch partitions its view along the keys: the grid's splits, the partition granule
/// (decode_keys_per_split's tile) and balance. launch_decode passes these to the split kernel
/// and the merge alike, so both cut the view at the same keys.
struct SplitGrid {
  int n_splits = 0;
  int granule = 0;
  int balance = 0;
};
SplitGrid split_grid(const DecodePlan& plan, int T);

/// What a launch runs for a view of view_keys keys (a verify's union of views): the kernel
/// and its loop trips, from the same arithmetic as launch_decode and begin_split.
struct LaunchShape {
  SplitChoice choice;
  int row_blocks = 0;
  SplitGrid grid;
  int active_splits = 0;            ///< splits with keys: ceil(view / keys_per_split)
  std::int64_t keys_per_split = 0;  ///< the longest split's keys
  int loop_keys = 0;                ///< keys one trip of the kernel's key loop takes per warp
  std::int64_t loop_trips = 0;      ///< trips of the longest split's key loop (per warp)
};
LaunchShape launch_shape(const DecodePlan& plan, int T, std::int64_t view_keys);

/// Alignment the decode needs of k_plane, v_plane (it issues 4/8/16-byte vector loads).
/// NOTE: cudaMalloc pointers qualify; a plane must not start at an offset into a buffer.
inline constexpr std::size_t kDecodePlaneAlignment = 16;

/// Chooses the grid for a geometry and the layer's options. Pure host arithmetic: it reads
/// nothing but its arguments. Throws kvlayer::Error (refused) naming the value and the
/// supported set for an unsupported head dim (kSupportedHeadDims), gqa (1..16), n_kv_heads < 1,
/// max_view_keys outside [1, 2^31 − 1], multiprocessor_count < 1 or an option out of range.
DecodePlan plan_decode(int n_kv_heads, int head_dim, int gqa, std::int64_t max_view_keys,
                       int multiprocessor_count, const DecodeOptions& options);

/// The same for an explicit kernel and split balance, the other options at their defaults
/// (tests, benchmarks).
DecodePlan plan_decode(int n_kv_heads, int head_dim, int gqa, std::int64_t max_view_keys,
                       int multiprocessor_count, DecodeKernel kernel,
                       int split_balance = DecodeOptions::kDefaultSplitBalance);

/// Blocks of the tensor-core split kernel a decode of `plan` runs (select_split_kernel) that one
/// multiprocessor of the current device holds at once (CUDA occupancy API, with the launch's
/// attributes applied). The plan sizes its grid for decode_mma_blocks_per_sm(head_dim, rows).
/// cudaErrorInvalidValue for a cuda_core plan.
cudaError_t mma_split_resident_blocks(const DecodePlan& plan, int* blocks);

/// Whether decode_wgmma_verify.cu runs on a device of compute capability major.minor: only an
/// sm_90a build (CMake: 90 among the CUDA architectures) on a 9.0 device.
bool wgmma_verify_supported(int major, int minor);

/// The same for a verify instance (SplitKernel mma_verify, mma_direct_verify or wgmma_verify) of
/// head_dim and `rows` query rows per block; verify_wave_blocks sizes a verify grid for its
/// kSplitInstances entry.
cudaError_t mma_verify_resident_blocks(SplitKernel kernel, int head_dim, int rows, int* blocks);

/// One decode launch.
struct DecodeArgs {
  const std::uint8_t* k_plane = nullptr;  ///< q8_0 rows, k_tok_bytes each
  const std::uint8_t* v_plane = nullptr;  ///< q5_1 rows, v_tok_bytes each
  std::int64_t rows = 0;                  ///< physical rows of each plane
  std::int64_t max_ctx = 0;
  std::int64_t window = 0;  ///< 0: attend [0, len); else [max(0, len − window), len)
  /// Device-counter mode when len_d != nullptr (base_d may be null: base 0). Else host mode.
  const std::int32_t* len_d = nullptr;
  const std::int32_t* base_d = nullptr;
  std::int64_t host_len = 0;
  std::int64_t host_base = 0;
  /// 0: a decode. T ≥ 1: a verify decode of T queries (SPEC §11), q and out [T, ·, head_dim].
  int queries = 0;
  const float* q = nullptr;  ///< [n_kv_heads·gqa, head_dim] f32 (× queries for verify)
  float* out = nullptr;      ///< [n_kv_heads·gqa, head_dim] f32 (× queries for verify)
  float scale = 0;
  void* scratch = nullptr;         ///< plan.scratch_bytes, allocated once
  DeviceStatus* status = nullptr;  ///< device errors (view too long / outside rows)
  /// A batch launch (SPEC §12) when batch.slots != null: the sequences' planes, counters and
  /// status come from the slots of the active list's entries (k_plane, v_plane, len_d, base_d
  /// and status above are then unused); q and out hold a position of [T, ·, head_dim] per
  /// entry of the list (position j: entry j), scratch max_batch · batch_scratch_stride(plan).
  BatchList batch{};
  int max_batch = 0;
  bool windowed = false;  ///< a batch's views: _dcw (len_d and base_d); else _dc (len_d, base 0)
  /// A batch launch's schedule buffers (batch_max_items(plan, max_batch) items); null: the
  /// launch is positional (one grid slice per position).
  BatchSchedule schedule{};
};

/// Scratch bytes of one position of a batch launch: plan.scratch_bytes rounded up to 256, so
/// that every position's partials keep the alignment the kernels' vector accesses need.
inline std::size_t batch_scratch_stride(const DecodePlan& plan) {
  return (plan.scratch_bytes + 255) / 256 * 256;
}

/// Enqueues the decode (split kernel + merge) on stream. Capturable: no host sync, no
/// allocation. A device-mode view longer than plan.max_view_keys, or outside the resident rows,
/// writes nothing to out and records DeviceErrorKind::decode_view_too_long.
cudaError_t launch_decode(const DecodeArgs& args, const DecodePlan& plan, cudaStream_t stream);

}  // namespace kvlayer::cuda::detail
