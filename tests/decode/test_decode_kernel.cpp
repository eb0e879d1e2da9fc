// GPU tests of the split-K decode kernel (cuda/src/decode/) against the float64 reference,
// within the declared accuracy contract (reference/include/kvlayer/reference/accuracy.hpp).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "decode/partition.hpp"
#include "decode/view_begin.hpp"
#include "decode_model.hpp"
#include "decode_testbed.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/status.hpp"
#include "kvlayer/testing/geometry.hpp"
#include "kvlayer/testing/gpu.hpp"

namespace kvlayer::testing {
namespace {

using cuda::detail::plan_decode;

/// The plan a layer constructed now would make: the environment's options (device-check runs
/// this binary under KVLAYER_DECODE_KERNEL=cuda_core too).
cuda::detail::DecodePlan plan_decode(int n_kv, int head_dim, int gqa, std::int64_t keys, int sms) {
  return plan_decode(n_kv, head_dim, gqa, keys, sms, cuda::DecodeOptions::from_environment());
}

std::vector<float> random_query(Rng& rng, int n_q_heads, int head_dim, float amplitude) {
  std::vector<float> q(std::size_t(n_q_heads) * head_dim);
  for (float& x : q) x = amplitude * rng.sym();
  return q;
}

/// The view the reference layer's decode() attends (host len / base).
ref::DecodeView reference_view(const ref::KvLayer& layer) {
  const auto [begin, end] = layer.view();
  return ref::DecodeView{begin, end, layer.base()};
}

/// Runs host mode and device mode on the layer's current state and checks both against the
/// reference (`want`, computed here when not given); device mode must also be bit-identical
/// to host mode (same partition).
void check_both_modes(DecodeBed& bed, const ref::KvLayer& layer, std::span<const float> q,
                      float scale, const std::string& what,
                      const std::vector<double>* given = nullptr) {
  const int nq = bed.n_q_heads();
  const std::vector<double> want = given != nullptr ? *given : layer.decode(q, nq, scale);
  const ref::DecodeView view = reference_view(layer);
  const bool expect_nonzero = true;

  std::vector<float> host, dev;
  ASSERT_EQ(bed.run(bed.host_args(layer.len(), layer.base(), scale), host), cudaSuccess) << what;
  expect_within_contract(host, want, layer, q, nq, scale, view, bed.plan(), what + " [host]",
                         expect_nonzero);

  bed.set_counters(std::int32_t(layer.len()), std::int32_t(layer.base()));
  bed.clear_status();
  ASSERT_EQ(bed.run(bed.device_args(scale), dev), cudaSuccess) << what;
  EXPECT_EQ(bed.read_status().has_device_error, 0) << what << " [device]";
  EXPECT_EQ(std::memcmp(host.data(), dev.data(), host.size() * sizeof(float)), 0)
      << what << ": device-counter output differs from host-len output";
}

// ---- Plan (host arithmetic only: no GPU needed) ----------------------------------------------

TEST(DecodePlan, FillsTheGpuAtLongViews) {
  const auto p = plan_decode(8, 128, 8, 131072, 132, cuda::detail::DecodeKernel::cuda_core);
  EXPECT_EQ(p.tile_keys, 32);
  EXPECT_EQ(p.n_splits, 66);              // 8 heads × 66 = 528 blocks = 4 per SM
  EXPECT_EQ(p.max_keys_per_split, 2016);  // ceil(131072 / 66) = 1986 → whole tiles
  EXPECT_EQ(p.scratch_bytes, std::size_t(8) * 66 * 8 * (128 + 2) * 4);
  // A short view: no split shorter than a tile.
  const auto s = plan_decode(1, 64, 1, 10, 132, cuda::detail::DecodeKernel::cuda_core);
  EXPECT_EQ(s.n_splits, 1);
  EXPECT_EQ(s.max_keys_per_split, 64);
}

TEST(DecodePlan, MmaPlanFillsTheGpu) {
  using cuda::detail::DecodeKernel;
  const auto p = plan_decode(8, 128, 8, 131072, 132, DecodeKernel::mma);
  EXPECT_EQ(p.kernel, DecodeKernel::mma);
  EXPECT_EQ(p.tile_keys, 64);
  EXPECT_EQ(p.n_splits, 49);              // 3 blocks per SM at D 128, gqa 8: 392 ≤ 396
  EXPECT_EQ(p.max_keys_per_split, 2688);  // ceil(131072 / 49) = 2675 → whole 64-key tiles
  EXPECT_EQ(p.max_rescales, 2688 / 64 + 1);
  // Never a second wave: every (KV head, split, row block) block is resident at once.
  for (const int n_kv : {1, 3, 8, 32})
    for (const int d : cuda::kSupportedHeadDims)
      for (const int gqa : {4, 9, 16}) {
        const auto q = plan_decode(n_kv, d, gqa, 131072, 132, DecodeKernel::mma);
        const int rows = cuda::detail::select_split_kernel(q, 0).rows;
        EXPECT_LE(q.n_splits * n_kv * cuda::detail::row_chunks(q, 0),
                  cuda::detail::decode_mma_blocks_per_sm(d, rows) * 132)
            << n_kv << " KV heads, D " << d << ", gqa " << gqa;
      }
  EXPECT_EQ(plan_decode(8, 64, 8, 131072, 132, DecodeKernel::mma).n_splits, 66);   // 4 per SM
  EXPECT_EQ(plan_decode(8, 256, 8, 131072, 132, DecodeKernel::mma).n_splits, 33);  // 2 per SM
  // gqa > 8: 16 rows per block (2 per SM) where the splits fill 3/4 of those slots, else two
  // blocks of ≤ 8 rows (3 per SM at head dim 128).
  const auto g8 = plan_decode(8, 128, 16, 131072, 132, DecodeKernel::mma);  // 8 × 33 of 264
  EXPECT_FALSE(g8.split_rows);
  EXPECT_EQ(cuda::detail::row_chunks(g8, 0), 1);
  EXPECT_EQ(g8.n_splits, 33);
  const auto g1 = plan_decode(1, 128, 16, 131072, 132, DecodeKernel::mma);  // 171 of 264
  EXPECT_TRUE(g1.split_rows);
  EXPECT_EQ(cuda::detail::row_chunks(g1, 0), 2);
  EXPECT_EQ(g1.n_splits, 171);  // the longest view fills ⌈131072 / 768⌉ (2·362 → 768 keys)
  const auto g9 = plan_decode(1, 128, 9, 131072, 132, DecodeKernel::mma);
  EXPECT_EQ(cuda::detail::row_chunks(g9, 0), 2);  // 5 + 4 rows
  EXPECT_EQ(cuda::detail::row_chunks(plan_decode(1, 256, 16, 131072, 132, DecodeKernel::mma), 0),
            2);
  EXPECT_EQ(cuda::detail::row_chunks(plan_decode(2, 256, 16, 131072, 132, DecodeKernel::mma), 0),
            1);  // 2 × 171 of 264
  EXPECT_EQ(cuda::detail::row_chunks(plan_decode(1, 64, 16, 131072, 132, DecodeKernel::mma), 0),
            1);  // the staged kernel's 16 rows
  EXPECT_EQ(plan_decode(1, 128, 16, 1 << 20, 132, DecodeKernel::mma).split_rows, false);
}

// The one chooser: every shape gets exactly the kernel and compile-time shape the launchers hold.
TEST(DecodePlan, TheSelectorNamesEveryKernel) {
  using cuda::detail::DecodeKernel;
  using cuda::detail::SplitKernel;
  struct Case {
    int d, gqa, queries;
    DecodeKernel family;
    SplitKernel kernel;
    int rows;
    bool wgmma = false;  ///< plan_verify's: the device and the build have warpgroup MMA
  };
  const Case cases[] = {
      {128, 8, 0, DecodeKernel::mma, SplitKernel::mma_direct, 8},
      {128, 4, 0, DecodeKernel::mma, SplitKernel::mma_direct, 8},
      {128, 16, 0, DecodeKernel::mma, SplitKernel::mma_direct, 16},
      {128, 9, 0, DecodeKernel::mma, SplitKernel::mma_direct, 16},
      {64, 8, 0, DecodeKernel::mma, SplitKernel::mma_staged, 8},
      {256, 8, 0, DecodeKernel::mma, SplitKernel::mma_bulk, 8},
      {256, 1, 0, DecodeKernel::mma, SplitKernel::mma_bulk, 8},
      {256, 12, 0, DecodeKernel::mma, SplitKernel::mma_staged, 16},
      {256, 3, 0, DecodeKernel::cuda_core, SplitKernel::cuda_core, 4},
      {64, 16, 0, DecodeKernel::cuda_core, SplitKernel::cuda_core, 16},
      // A verify of one query is a decode on tensor cores, whatever the family.
      {128, 8, 1, DecodeKernel::cuda_core, SplitKernel::mma_direct, 8},
      {64, 16, 1, DecodeKernel::mma, SplitKernel::mma_staged, 16},
      {256, 4, 1, DecodeKernel::cuda_core, SplitKernel::mma_bulk, 8},
      // Verify of T >= 2 at head dim 128: T·gqa ≤ 16 on the direct kernel's 8 or 16 rows,
      // more in blocks of 32 or 64 query rows of the verify kernel.
      {128, 8, 2, DecodeKernel::mma, SplitKernel::mma_direct_verify, 16},
      {128, 4, 2, DecodeKernel::mma, SplitKernel::mma_direct_verify, 8},
      {128, 1, 2, DecodeKernel::mma, SplitKernel::mma_direct_verify, 8},
      {128, 1, 9, DecodeKernel::mma, SplitKernel::mma_direct_verify, 16},
      {128, 4, 4, DecodeKernel::cuda_core, SplitKernel::mma_direct_verify, 16},
      {128, 1, 17, DecodeKernel::mma, SplitKernel::mma_verify, 32},
      {128, 8, 4, DecodeKernel::mma, SplitKernel::mma_verify, 32},
      {128, 3, 7, DecodeKernel::mma, SplitKernel::mma_verify, 32},
      {128, 3, 11, DecodeKernel::mma, SplitKernel::mma_verify, 64},
      {128, 8, 16, DecodeKernel::cuda_core, SplitKernel::mma_verify, 64},
      // Where the device has warpgroup MMA: more than 16 rows at head dim 128 on the wgmma
      // kernel, in blocks of 64 rows (one warpgroup) up to 64, else of 128 (two); 16 or fewer,
      // and the other head dims, as without it.
      {128, 1, 17, DecodeKernel::mma, SplitKernel::wgmma_verify, 64, true},
      {128, 8, 4, DecodeKernel::mma, SplitKernel::wgmma_verify, 64, true},
      {128, 8, 8, DecodeKernel::mma, SplitKernel::wgmma_verify, 64, true},
      {128, 3, 22, DecodeKernel::mma, SplitKernel::wgmma_verify, 128, true},
      {128, 8, 16, DecodeKernel::cuda_core, SplitKernel::wgmma_verify, 128, true},
      {128, 8, 2, DecodeKernel::mma, SplitKernel::mma_direct_verify, 16, true},
      {128, 8, 1, DecodeKernel::mma, SplitKernel::mma_direct, 8, true},
      {256, 8, 8, DecodeKernel::mma, SplitKernel::mma_verify, 32, true},
      {64, 8, 2, DecodeKernel::mma, SplitKernel::mma_verify_staged, 16, true},
      // Head dim 256: 8-row groups, at least two of them.
      {256, 1, 5, DecodeKernel::cuda_core, SplitKernel::mma_verify, 16},
      {256, 8, 2, DecodeKernel::mma, SplitKernel::mma_verify, 16},
      {256, 8, 8, DecodeKernel::mma, SplitKernel::mma_verify, 32},
      // Head dim 64: the staged verify, 16 rows per block.
      {64, 8, 2, DecodeKernel::mma, SplitKernel::mma_verify_staged, 16},
  };
  for (const Case& c : cases) {
    auto p = plan_decode(8, c.d, c.gqa, 4096, 132, c.family);
    cuda::detail::plan_verify(p, 64, 4096, 132, c.wgmma);
    const cuda::detail::SplitChoice got = cuda::detail::select_split_kernel(p, c.queries);
    EXPECT_TRUE(got.kernel == c.kernel && got.rows == c.rows)
        << "D " << c.d << " gqa " << c.gqa << " queries " << c.queries << " wgmma " << c.wgmma
        << ": got " << cuda::detail::split_kernel_name(got.kernel) << " rows " << got.rows
        << ", expected " << cuda::detail::split_kernel_name(c.kernel) << " rows " << c.rows;
  }
  EXPECT_STREQ(cuda::detail::split_kernel_name(SplitKernel::mma_bulk), "mma_bulk");
  EXPECT_STREQ(cuda::detail::split_kernel_name(SplitKernel::mma_verify), "mma_verify");
  EXPECT_STREQ(cuda::detail::split_kernel_name(SplitKernel::mma_direct_verify),
               "mma_direct_verify");
  EXPECT_STREQ(cuda::detail::split_kernel_name(SplitKernel::mma_verify_staged),
               "mma_verify_staged");
  EXPECT_STREQ(cuda::detail::split_kernel_name(SplitKernel::wgmma_verify), "wgmma_verify");
  // Warpgroup MMA: only an sm_90a build (this build's CMake: 90 among the architectures) on a
  // 9.0 device.
  EXPECT_FALSE(cuda::detail::wgmma_verify_supported(8, 0));
  EXPECT_FALSE(cuda::detail::wgmma_verify_supported(10, 0));
  EXPECT_FALSE(cuda::detail::wgmma_verify_supported(9, 1));
}

// Verify grids: T·gqa rows in blocks of the selected rows (blockIdx.z), the splits sharing one
// resident wave, and the shape the bound takes; T = 1 is the decode's grid.
TEST(DecodePlan, VerifyRowBlocksAndShape) {
  auto p = plan_decode(8, 128, 8, 131072, 132, cuda::detail::DecodeKernel::mma);
  cuda::detail::plan_verify(p, 16, 131072, 132);
  EXPECT_EQ(cuda::detail::row_chunks(p, 1), 1);
  EXPECT_EQ(cuda::detail::row_chunks(p, 2), 1);   // 16 rows: the direct kernel's n-tiles
  EXPECT_EQ(cuda::detail::row_chunks(p, 8), 1);   // 64 rows, four row groups
  EXPECT_EQ(cuda::detail::row_chunks(p, 16), 2);  // 128 rows
  EXPECT_EQ(cuda::detail::verify_splits(p, 1), p.n_splits);
  // Each T's kernel fills its own wave: the direct kernel's 16-row instance at T = 2, the verify
  // kernel's beyond.
  const int direct =
      cuda::detail::split_blocks_per_sm(cuda::detail::SplitKernel::mma_direct_verify, 128, 16) *
      132;
  const int blocks =
      cuda::detail::split_blocks_per_sm(cuda::detail::SplitKernel::mma_verify, 128, 64) * 132;
  EXPECT_EQ(cuda::detail::verify_wave_blocks(p, 2), direct);
  EXPECT_EQ(cuda::detail::verify_wave_blocks(p, 8), blocks);
  EXPECT_EQ(cuda::detail::verify_splits(p, 2), direct / 8);
  EXPECT_EQ(cuda::detail::verify_splits(p, 8), blocks / 8);
  EXPECT_EQ(cuda::detail::verify_splits(p, 16), blocks / 16);
  // At gqa 4, T = 2 takes the 8-row instance and its wave (3 per multiprocessor).
  auto p4 = plan_decode(8, 128, 4, 131072, 132, cuda::detail::DecodeKernel::mma);
  cuda::detail::plan_verify(p4, 16, 131072, 132);
  EXPECT_EQ(
      cuda::detail::verify_splits(p4, 2),
      cuda::detail::split_blocks_per_sm(cuda::detail::SplitKernel::mma_direct_verify, 128, 8) *
          132 / 8);
  const kvlayer::AccumulationShape t1 = cuda::detail::verify_accumulation_shape(p, 1);
  const kvlayer::AccumulationShape t2 = cuda::detail::verify_accumulation_shape(p, 2);
  const kvlayer::AccumulationShape t4 = cuda::detail::verify_accumulation_shape(p, 4);
  const kvlayer::AccumulationShape t8 = cuda::detail::verify_accumulation_shape(p, 8);
  EXPECT_EQ(t1.pv_mma_steps, p.pv_mma_steps);  // the decode's kernel and grid
  EXPECT_EQ(t1.n_splits, p.n_splits);
  // A warp's chain: every 4th 16-key tile (the direct kernel at T = 2), two m-tiles per 64-key
  // tile (2 key groups), four (1).
  EXPECT_EQ(t2.pv_mma_steps, t2.max_keys_per_split / 64);
  EXPECT_EQ(t4.pv_mma_steps, t4.max_keys_per_split / 64 * 2);
  EXPECT_EQ(t8.pv_mma_steps, t8.max_keys_per_split / 64 * 4);
  // Max updates: one per tile (one or two m-tiles per warp), two (four m-tiles, in pairs).
  EXPECT_EQ(t2.rescales, t2.max_keys_per_split / 64 + 1);
  EXPECT_EQ(t4.rescales, t4.max_keys_per_split / 64 + 1);
  EXPECT_EQ(t8.rescales, t8.max_keys_per_split / 64 * 2 + 1);
  // The verify kernel folds d into fp16 K (accuracy.hpp (1), fused form); T = 1 is the decode's
  // and T = 2 the direct kernel's (exact quants).
  EXPECT_FALSE(t1.k_fused_f16);
  EXPECT_FALSE(t2.k_fused_f16);
  EXPECT_TRUE(t4.k_fused_f16 && t8.k_fused_f16);
  // Head dim 256: 32-key tiles, 32 rows per block; at T = 8 a warp takes both m-tiles of a
  // tile in one softmax step.
  auto q = plan_decode(4, 256, 8, 131072, 132, cuda::detail::DecodeKernel::mma);
  cuda::detail::plan_verify(q, 16, 131072, 132);
  EXPECT_EQ(cuda::detail::row_chunks(q, 8), 2);
  const kvlayer::AccumulationShape q8 = cuda::detail::verify_accumulation_shape(q, 8);
  EXPECT_EQ(q8.pv_mma_steps, q8.max_keys_per_split / 32 * 2);
  EXPECT_EQ(q8.rescales, q8.max_keys_per_split / 32 + 1);
  EXPECT_FALSE(q8.k_fused_f16);  // verify_folds_k: head dim 128 only
  // The staged verify (head dim 64): 16 rows per block, every 4th 16-key tile per warp.
  auto r = plan_decode(4, 64, 8, 131072, 132, cuda::detail::DecodeKernel::mma);
  cuda::detail::plan_verify(r, 16, 131072, 132);
  EXPECT_EQ(cuda::detail::row_chunks(r, 8), 4);
  const kvlayer::AccumulationShape r8 = cuda::detail::verify_accumulation_shape(r, 8);
  EXPECT_EQ(r8.pv_mma_steps, r8.max_keys_per_split / 64);
  EXPECT_EQ(r8.rescales, r8.pv_mma_steps + 1);
  EXPECT_FALSE(r8.k_fused_f16);  // exact quants, d per block
}

// The plan sizes its grid for decode_mma_blocks_per_sm resident blocks; if fewer fit (registers,
// shared memory, carveout), the grid runs in two waves and the decode takes about twice as long.
TEST(DecodePlan, MmaBlocksPerSmAreResident) {
  KVLAYER_REQUIRE_GPU();
  // One KV head at gqa 16 splits its rows (8 per block); eight do not (16 per block).
  for (const int n_kv : {1, 8})
    for (const int d : cuda::kSupportedHeadDims)
      for (const int gqa : {8, 16}) {
        const auto plan = plan_decode(n_kv, d, gqa, 131072, 132, cuda::detail::DecodeKernel::mma);
        const int rows = cuda::detail::select_split_kernel(plan, 0).rows;
        int blocks = 0;
        ASSERT_EQ(cuda::detail::mma_split_resident_blocks(plan, &blocks), cudaSuccess);
        EXPECT_GE(blocks, cuda::detail::decode_mma_blocks_per_sm(d, rows))
            << n_kv << " KV heads, D " << d << " gqa " << gqa << " rows " << rows;
      }
  for (const cuda::detail::SplitInstance& i : cuda::detail::kSplitInstances) {
    if (i.kernel != cuda::detail::SplitKernel::mma_verify &&
        i.kernel != cuda::detail::SplitKernel::mma_direct_verify &&
        i.kernel != cuda::detail::SplitKernel::wgmma_verify)
      continue;
    if (i.kernel == cuda::detail::SplitKernel::wgmma_verify) {
      int dev = 0, major = 0, minor = 0;
      ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
      ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                cudaSuccess);
      if (!cuda::detail::wgmma_verify_supported(major, minor)) continue;  // never launched here
    }
    int blocks = 0;
    ASSERT_EQ(cuda::detail::mma_verify_resident_blocks(i.kernel, i.head_dim, i.rows, &blocks),
              cudaSuccess);
    EXPECT_GE(blocks, i.blocks_per_sm)
        << cuda::detail::split_kernel_name(i.kernel) << " D " << i.head_dim << " rows " << i.rows;
  }
}

// The instance table is what select_split_kernel chooses from: every choice, for every head
// dim, gqa, kernel family, row choice, batch and T, is a compiled instance (split_instances.hpp).
TEST(DecodePlan, EveryKernelChoiceIsACompiledInstance) {
  using cuda::detail::SplitChoice;
  int checked = 0;
  for (const int d : cuda::kSupportedHeadDims)
    for (int gqa = 1; gqa <= cuda::kMaxGqa; ++gqa)
      for (const auto kernel :
           {cuda::DecodeOptions::Kernel::mma, cuda::DecodeOptions::Kernel::cuda_core})
        for (const auto rows : {cuda::DecodeOptions::Rows::automatic,
                                cuda::DecodeOptions::Rows::split, cuda::DecodeOptions::Rows::whole})
          for (const bool batch : {false, true})
            for (const bool wgmma : {false, true}) {
              cuda::DecodeOptions o;
              o.kernel = kernel;
              o.rows = rows;
              auto plan = plan_decode(1, d, gqa, 65536, 132, o);
              cuda::detail::plan_verify(plan, cuda::kMaxVerify, 65536, 132, wgmma);
              plan.batch = batch;
              for (int t = 0; t <= cuda::kMaxVerify; ++t) {
                const SplitChoice c = cuda::detail::select_split_kernel(plan, t);
                EXPECT_TRUE(cuda::detail::split_instance_built(c.kernel, d, c.rows))
                    << cuda::detail::split_kernel_name(c.kernel) << " D " << d << " rows " << c.rows
                    << " (gqa " << gqa << ", T " << t << ")";
                ++checked;
              }
            }
  EXPECT_GT(checked, 1000);
  // And the table has no instance the selector cannot reach.
  for (const cuda::detail::SplitInstance& i : cuda::detail::kSplitInstances) {
    bool reached = false;
    for (int gqa = 1; gqa <= cuda::kMaxGqa && !reached; ++gqa)
      for (const auto kernel :
           {cuda::DecodeOptions::Kernel::mma, cuda::DecodeOptions::Kernel::cuda_core})
        for (const auto rows : {cuda::DecodeOptions::Rows::split, cuda::DecodeOptions::Rows::whole})
          for (const bool batch : {false, true})
            for (const bool wgmma : {false, true}) {
              cuda::DecodeOptions o;
              o.kernel = kernel;
              o.rows = rows;
              auto plan = plan_decode(1, i.head_dim, gqa, 65536, 132, o);
              cuda::detail::plan_verify(plan, cuda::kMaxVerify, 65536, 132, wgmma);
              plan.batch = batch;
              for (int t = 0; t <= cuda::kMaxVerify && !reached; ++t) {
                const SplitChoice c = cuda::detail::select_split_kernel(plan, t);
                reached = c.kernel == i.kernel && c.rows == i.rows;
              }
            }
    EXPECT_TRUE(reached) << cuda::detail::split_kernel_name(i.kernel) << " D " << i.head_dim
                         << " rows " << i.rows << " is compiled but never chosen";
  }
}

// The campaign's coverage floors (decode_instances) list the warpgroup-MMA verify's two
// instances where the device has it, and nothing else differs.
TEST(DecodePlan, CoverageFloorsListTheWgmmaVerifyWhereTheDeviceHasIt) {
  using cuda::detail::kWgmmaVerifyRows;
  const auto with = cuda::decode_instances(true), without = cuda::decode_instances(false);
  const auto count = [](const std::vector<cuda::DecodeInstance>& list, const std::string& kernel,
                        int head_dim, int rows) {
    return std::count_if(list.begin(), list.end(), [&](const cuda::DecodeInstance& i) {
      return i.kernel == kernel && i.head_dim == head_dim && (rows == 0 || i.rows == rows);
    });
  };
  EXPECT_EQ(count(without, "wgmma_verify", 128, 0), 0);
  for (const int rows : {kWgmmaVerifyRows, 2 * kWgmmaVerifyRows})
    EXPECT_EQ(count(with, "wgmma_verify", 128, rows), 1) << "rows " << rows;
  EXPECT_EQ(with.size(), without.size() + 2);
  for (const cuda::DecodeInstance& i : without)
    EXPECT_EQ(count(with, i.kernel, i.head_dim, i.rows), 1) << i.kernel << " d" << i.head_dim;
}

// isqrt starts from the f32 root and corrects it in integers: exact where f32 rounds n the
// most (next to squares) up to the largest view.
TEST(DecodePlan, IntegerSquareRootIsExact) {
  for (std::uint64_t k = 0; k <= 46341; ++k)
    for (const std::int64_t dn :
         {std::int64_t(-1), std::int64_t(0), std::int64_t(1), std::int64_t(k)}) {
      const std::int64_t n = std::int64_t(k * k) + dn;
      if (n < 0 || n > std::numeric_limits<std::int32_t>::max()) continue;
      const std::uint64_t r = cuda::detail::isqrt(std::uint32_t(n));
      ASSERT_TRUE(r * r <= std::uint64_t(n) && (r + 1) * (r + 1) > std::uint64_t(n)) << n;
    }
}

// The one view start the host checks and the device use is the reference's: query 0's view of a
// verify (decode: T = 1), with and without a window.
TEST(DecodePlan, ViewBeginIsTheReferencesFirstView) {
  for (const std::int64_t window : {0, 1, 5, 64, 100})
    for (std::int64_t len = 1; len <= 300; ++len)
      for (int T = 1; T <= 8 && T <= len; ++T) {
        Geometry g = flat_geometry(1, 64, 64, 300);
        if (window > 0) g.window = window;
        ASSERT_EQ(cuda::detail::view_begin(len, T, window),
                  ref::verify_views(g, len, 0, T).front().begin)
            << "len " << len << " T " << T << " window " << window;
      }
}

TEST(DecodePlan, PartitionCoversEveryViewExactly) {
  for (const int head_dim : cuda::kSupportedHeadDims)
    for (const int sms : {1, 3, 132}) {
      const auto p = plan_decode(3, head_dim, 2, 5000, sms);
      for (std::int64_t n = 1; n <= p.max_view_keys; ++n) {
        const std::int64_t kps =
            cuda::detail::decode_keys_per_split(n, p.n_splits, p.tile_keys, p.split_balance);
        const std::int64_t active = (n + kps - 1) / kps;
        ASSERT_EQ(kps % p.tile_keys, 0);
        ASSERT_LE(kps, p.max_keys_per_split) << "n " << n;
        ASSERT_LE(active, p.n_splits) << "n " << n;
        ASSERT_LT((active - 1) * kps, n);
      }
    }
}

// DecodeOptions::rows forces the gqa > 8 row choice where the kernel has both instances.
TEST(DecodePlan, RowsOption) {
  using Rows = cuda::DecodeOptions::Rows;
  const auto with = [](Rows rows) {
    cuda::DecodeOptions o;
    o.rows = rows;
    return o;
  };
  EXPECT_FALSE(plan_decode(1, 128, 16, 131072, 132, with(Rows::whole)).split_rows);
  EXPECT_TRUE(plan_decode(8, 128, 16, 131072, 132, with(Rows::split)).split_rows);
  EXPECT_FALSE(plan_decode(8, 128, 8, 131072, 132, with(Rows::split)).split_rows);  // gqa ≤ 8
  EXPECT_FALSE(plan_decode(8, 64, 16, 131072, 132, with(Rows::split)).split_rows);  // staged
  EXPECT_TRUE(plan_decode(1, 128, 16, 131072, 132, with(Rows::automatic)).split_rows);
  EXPECT_FALSE(plan_decode(8, 128, 16, 131072, 132, with(Rows::automatic)).split_rows);
}

// The planner reads its options only: the environment changes nothing once they are made.
TEST(DecodePlan, PlannerIgnoresTheEnvironment) {
  struct Restore {
    ~Restore() { ::unsetenv("KVLAYER_DECODE_ROWS"); }
  } restore;
  ::setenv("KVLAYER_DECODE_ROWS", "whole", 1);
  EXPECT_TRUE(plan_decode(1, 128, 16, 131072, 132, cuda::DecodeOptions{}).split_rows);
  ::setenv("KVLAYER_DECODE_ROWS", "halves", 1);
  EXPECT_NO_THROW(plan_decode(1, 128, 16, 131072, 132, cuda::DecodeOptions{}));
}

// from_environment reads the four variables and refuses anything else, naming the value.
TEST(DecodeOptions, FromTheEnvironment) {
  const char* vars[] = {"KVLAYER_DECODE_ROWS", "KVLAYER_DECODE_KERNEL", "KVLAYER_SPLIT_BALANCE",
                        "KVLAYER_BATCH_WAVES", "KVLAYER_VERIFY_KERNEL"};
  struct Restore {
    const char* const* vars;
    ~Restore() {
      for (int i = 0; i < 5; ++i) ::unsetenv(vars[i]);
    }
  } restore{vars};
  for (const char* v : vars) ::unsetenv(v);
  EXPECT_EQ(cuda::DecodeOptions::from_environment(), cuda::DecodeOptions{});
  ::setenv("KVLAYER_DECODE_ROWS", "whole", 1);
  ::setenv("KVLAYER_DECODE_KERNEL", "cuda_core", 1);
  ::setenv("KVLAYER_SPLIT_BALANCE", "17", 1);
  ::setenv("KVLAYER_BATCH_WAVES", "9", 1);
  ::setenv("KVLAYER_VERIFY_KERNEL", "wgmma", 1);
  const auto o = cuda::DecodeOptions::from_environment();
  EXPECT_EQ(o.verify, cuda::DecodeOptions::Verify::wgmma);
  EXPECT_EQ(o.rows, cuda::DecodeOptions::Rows::whole);
  EXPECT_EQ(o.kernel, cuda::DecodeOptions::Kernel::cuda_core);
  EXPECT_EQ(o.split_balance, 17);
  EXPECT_EQ(o.batch_waves, 9);
  EXPECT_EQ(o.max_verify_splits, 0);
  const auto expect_refused = [](const char* var, const char* value, const std::string& message) {
    const std::string old = std::getenv(var) ? std::getenv(var) : "";
    ::setenv(var, value, 1);
    try {
      cuda::DecodeOptions::from_environment();
      ADD_FAILURE() << var << "=" << value << " not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::refused);
      EXPECT_EQ(std::string(e.what()), message);
    }
    ::setenv(var, old.c_str(), 1);
  };
  expect_refused("KVLAYER_DECODE_ROWS", "halves",
                 "DecodeOptions: KVLAYER_DECODE_ROWS=halves is not a row choice (supported: auto, "
                 "split, whole)");
  expect_refused("KVLAYER_VERIFY_KERNEL", "auto",
                 "DecodeOptions: KVLAYER_VERIFY_KERNEL=auto is not a verify kernel (supported: "
                 "mma, wgmma)");
  expect_refused("KVLAYER_DECODE_KERNEL", "wmma",
                 "DecodeOptions: KVLAYER_DECODE_KERNEL=wmma is not a decode kernel (supported: "
                 "mma, cuda_core)");
  for (const char* bad : {"65", "-1", "8x", ""})
    expect_refused(
        "KVLAYER_SPLIT_BALANCE", bad,
        std::string("DecodeOptions: KVLAYER_SPLIT_BALANCE=") + bad + " is outside [0, 64]");
  for (const char* bad : {"0", "65", "4x", ""})
    expect_refused(
        "KVLAYER_BATCH_WAVES", bad,
        std::string("DecodeOptions: KVLAYER_BATCH_WAVES=") + bad + " is outside [1, 64]");
}

// A batch decode's grid: batch_waves resident waves of split blocks per KV head, plus one per
// position; each position's bound takes the shape of the splits the schedule gives it.
TEST(DecodePlan, BatchScheduleItemsAndShape) {
  for (const int waves : {1, 4, 64}) {
    cuda::DecodeOptions o;
    o.batch_waves = waves;
    const auto p = plan_decode(8, 128, 8, 131072, 132, o);
    // One wave: the resident split blocks of the device, shared by the KV heads.
    const int resident = cuda::detail::decode_mma_blocks_per_sm(128, 8) * 132;
    EXPECT_EQ(p.batch_items, waves * resident / 8) << waves;
    EXPECT_EQ(cuda::detail::batch_items(p, 1), p.batch_items) << waves;
    EXPECT_GE(cuda::detail::batch_max_items(p, 32), p.batch_items + 32) << waves;
  }
  // The host twin of the device's schedule: one long view alone is cut as one layer's decode
  // is; views of any lengths are cut by one length (at least 2·⌊√Σ⌋ keys), at most the
  // plan's per view, covering every key; an empty view accumulates nothing.
  const auto p = plan_decode(8, 128, 8, 131072, 132, cuda::DecodeOptions{});
  const std::int64_t one[] = {131072};
  const AccumulationShape alone = cuda::detail::batch_shapes(p, 1, one).at(0);
  EXPECT_EQ(alone.max_keys_per_split, cuda::detail::accumulation_shape(p).max_keys_per_split);
  EXPECT_EQ(alone.n_splits, p.n_splits);
  const std::vector<std::int64_t> keys = {0, 300, 4096, 4096, 131072, 65};
  const auto shapes = cuda::detail::batch_shapes(p, 1, keys);
  ASSERT_EQ(shapes.size(), keys.size());
  std::int64_t total = 0, items = 0;
  for (const std::int64_t n : keys) total += n;
  for (std::size_t j = 1; j < keys.size(); ++j) {
    const AccumulationShape& s = shapes[j];
    EXPECT_GE(s.max_keys_per_split * s.n_splits, keys[j]) << j;
    EXPECT_LT(s.max_keys_per_split * (s.n_splits - 1), keys[j]) << j;
    EXPECT_EQ(s.max_keys_per_split % cuda::detail::kDecodeMmaTileKeys, 0) << j;
    EXPECT_LE(s.n_splits, p.n_splits) << j;
    EXPECT_EQ(s.pv_mma_steps, s.max_keys_per_split / cuda::detail::kDecodeMmaTileKeys) << j;
    const std::int64_t floor = 2 * std::int64_t(std::sqrt(double(total)));  // balance 2
    EXPECT_LE(s.n_splits, (keys[j] + floor - 1) / floor) << j;
    items += s.n_splits;
  }
  EXPECT_EQ(shapes[2].max_keys_per_split, shapes[3].max_keys_per_split);
  EXPECT_GT(shapes[4].n_splits, shapes[2].n_splits);
  EXPECT_LE(items, cuda::detail::batch_max_items(p, int(keys.size())));
  EXPECT_EQ(shapes[0].max_keys_per_split, cuda::detail::accumulation_shape(p).max_keys_per_split);
  // A verify of T = 4 (the union of its rows' views): the verify kernel's splits, at most the
  // plan's verify splits per view, its tiles and steps.
  auto v = p;
  cuda::detail::plan_verify(v, 16, 131072, 132);
  const auto verify = cuda::detail::batch_shapes(v, 4, keys);
  const int most = cuda::detail::verify_splits(v, 4);
  for (std::size_t j = 1; j < keys.size(); ++j) {
    EXPECT_GE(verify[j].max_keys_per_split * verify[j].n_splits, keys[j]) << j;
    EXPECT_LE(verify[j].n_splits, most) << j;
    EXPECT_TRUE(verify[j].tensor_core);
  }
  EXPECT_GT(verify[4].n_splits, verify[2].n_splits);
  EXPECT_LE(cuda::detail::batch_items(v, 4) + 6, cuda::detail::batch_max_items(v, 6));
}

// The split balance and the verify split cap lengthen splits as asked: balance 64 runs a view of
// up to 4096 keys in one split (so a warp loops over many tiles), 0 gives one tile per split;
// max_verify_splits caps a verify's splits. launch_shape reports what a launch runs.
TEST(DecodePlan, OptionsReachLongAndShortSplits) {
  cuda::DecodeOptions longest;
  longest.split_balance = 64;
  longest.max_verify_splits = 1;
  const auto p = plan_decode(1, 128, 8, 4096, 132, longest);
  auto shape = cuda::detail::launch_shape(p, 0, 4096);
  EXPECT_EQ(shape.active_splits, 1);
  EXPECT_EQ(shape.loop_trips, 4096 / 64);
  auto q = plan_decode(1, 128, 8, 4096, 132, longest);
  cuda::detail::plan_verify(q, 64, 4096, 132);
  for (const int t : {2, 16, 17, 64}) {
    shape = cuda::detail::launch_shape(q, t, 4096);
    EXPECT_EQ(shape.grid.n_splits, 1) << t;
    EXPECT_EQ(shape.loop_trips, 4096 / cuda::detail::verify_tile_keys(128)) << t;
  }
  cuda::DecodeOptions finest;
  finest.split_balance = 0;
  const auto f = plan_decode(1, 128, 8, 65536, 132, finest);
  shape = cuda::detail::launch_shape(f, 0, 65536);
  EXPECT_GT(shape.active_splits, 256);  // a merge over more than 256 partials
  EXPECT_EQ(shape.loop_trips, (shape.keys_per_split + 63) / 64);
  const auto refused = [](const cuda::DecodeOptions& o, const std::string& message) {
    try {
      plan_decode(1, 128, 8, 4096, 132, o);
      ADD_FAILURE() << "not refused: " << message;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  cuda::DecodeOptions bad;
  bad.split_balance = 65;
  refused(bad, "plan_decode: split_balance 65 is outside [0, 64]");
  bad = {};
  bad.batch_waves = 0;
  refused(bad, "plan_decode: batch_waves 0 is outside [1, 64]");
  bad.batch_waves = 65;
  refused(bad, "plan_decode: batch_waves 65 is outside [1, 64]");
  bad = {};
  bad.max_verify_splits = -1;
  refused(bad, "plan_decode: max_verify_splits -1 is outside [0, 1024] (0: no cap)");
}

TEST(DecodePlan, RefusesUnsupportedGeometry) {
  const auto expect_refused = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "not refused: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::refused);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (const int d : {0, 32, 96, 192, 512}) {
    if (cuda::head_dim_supported(d)) continue;
    expect_refused([d] { plan_decode(8, d, 8, 1024, 132); }, "head_dim " + std::to_string(d));
    expect_refused([d] { plan_decode(8, d, 8, 1024, 132); }, cuda::supported_head_dims());
  }
  expect_refused([] { plan_decode(8, 128, 17, 1024, 132); }, "gqa 17");
  expect_refused([] { plan_decode(8, 128, 0, 1024, 132); }, "1..16");
  expect_refused([] { plan_decode(8, 128, 8, 0, 132); }, "max_view_keys 0");
  expect_refused([] { plan_decode(65536, 128, 8, 1024, 132); }, "[1, 65535]");
  auto p = plan_decode(8, 128, 8, 1024, 132);
  expect_refused([&] { cuda::detail::plan_verify(p, 65, 1024, 132); }, "max_verify 65");
}

// The limits table the refusals are built from.
TEST(DecodePlan, LimitsTable) {
  std::string listed;  // the refusals' list: the table in order, ", " between
  for (const int d : cuda::kSupportedHeadDims) {
    EXPECT_TRUE(cuda::head_dim_supported(d)) << d;
    EXPECT_EQ(d % 32, 0) << d;  // whole q8_0 / q5_1 blocks
    listed += (listed.empty() ? "" : ", ") + std::to_string(d);
  }
  EXPECT_EQ(cuda::supported_head_dims(), listed);
  for (const int d : {-64, 0, 1, 31, 33, 1 << 20}) EXPECT_FALSE(cuda::head_dim_supported(d)) << d;
  EXPECT_EQ(cuda::kMaxGqa, 16);
  EXPECT_GE(cuda::kMaxVerify, 16);  // SPEC §11
  EXPECT_LE(cuda::kDefaultMaxVerify, cuda::kMaxVerify);
}

// ---- Flat layers: lengths × head dims × gqa × plans ------------------------------------------

class DecodeSweep : public ::testing::TestWithParam<int> {};

TEST_P(DecodeSweep, FlatLengthsAgainstReference) {
  KVLAYER_REQUIRE_GPU();
  const int head_dim = GetParam();
  constexpr int kKv = 2;
  constexpr std::int64_t kMaxCtx = 4096;
  const Geometry g = flat_geometry(kKv, head_dim, head_dim, kMaxCtx);
  Rng rng(0xDEC0DE00u + head_dim);
  ref::KvLayer full(g);
  append_rows(full, random_values(rng, kMaxCtx, g.kv_dim_k()),
              random_values(rng, kMaxCtx, g.kv_dim_v()));
  const float scale = ref::default_scale(head_dim);
  // Plans: the real GPU (short splits), and tiny "GPUs" that force long splits with many tiles
  // per block (exercising the cp.async pipeline and the running-max rescale).
  const int sms[] = {device_sm_count(), 4, 1};

  for (const int gqa : {1, 4, 8, 16}) {
    std::vector<cuda::detail::DecodePlan> plans;
    for (int s : sms) plans.push_back(plan_decode(kKv, head_dim, gqa, kMaxCtx, s));
    // Lengths: tiny, around a block and a tile, around every plan's split boundaries.
    std::set<std::int64_t, std::greater<>> lengths = {1,    2,    31,   32,          33,     1000,
                                                      2047, 2048, 2049, kMaxCtx - 1, kMaxCtx};
    const std::int64_t tile = plans[0].tile_keys;
    for (std::int64_t n : {tile - 1, tile, tile + 1, 2 * tile + 1}) lengths.insert(n);
    for (const auto& p : plans)
      for (std::int64_t k : {1, 2, 3}) {
        const std::int64_t edge = std::int64_t(p.n_splits) * tile * k;
        for (std::int64_t n : {edge - 1, edge, edge + 1})
          if (n >= 1 && n <= kMaxCtx) lengths.insert(n);
      }

    ref::KvLayer layer = full;
    const std::vector<float> q = random_query(rng, kKv * gqa, head_dim, 2.0f);
    DecodeBed bed(g, gqa, plans[0]);
    bed.upload_planes(layer);
    bed.upload_query(q);
    for (const std::int64_t n : lengths) {  // descending: rewind only shortens
      layer.rewind(n);
      const std::vector<double> want = layer.decode(q, kKv * gqa, scale);
      for (const auto& p : plans) {
        bed.set_plan(p);
        const std::string what = "D " + std::to_string(head_dim) + " gqa " + std::to_string(gqa) +
                                 " len " + std::to_string(n) + " splits " +
                                 std::to_string(p.n_splits);
        check_both_modes(bed, layer, q, scale, what, &want);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(DecodeSweep, FlatWindowedViews) {
  KVLAYER_REQUIRE_GPU();
  const int head_dim = GetParam();
  constexpr int kKv = 3, kGqa = 4;
  const Geometry g = flat_geometry(kKv, head_dim, head_dim, 2500, 100);
  Rng rng(0x1A2B3C00u + head_dim);
  ref::KvLayer layer(g);
  append_rows(layer, random_values(rng, 2500, g.kv_dim_k()),
              random_values(rng, 2500, g.kv_dim_v()));
  const std::vector<float> q = random_query(rng, kKv * kGqa, head_dim, 2.0f);
  const float scale = ref::default_scale(head_dim);
  for (const int sms : {device_sm_count(), 1}) {
    ref::KvLayer l = layer;
    DecodeBed bed(g, kGqa, plan_decode(kKv, head_dim, kGqa, *g.window, sms));
    bed.upload_planes(l);
    bed.upload_query(q);
    for (const std::int64_t n : {2500, 1777, 101, 100, 99, 37, 1}) {
      l.rewind(n);
      check_both_modes(bed, l, q, scale, "windowed flat len " + std::to_string(n));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, DecodeSweep, ::testing::ValuesIn(cuda::kSupportedHeadDims),
                         [](const auto& info) {
                           return std::string("D").append(std::to_string(info.param));
                         });

/// No GPU needed: the host model over lengths and plans stays within the contract.
TEST_P(DecodeSweep, ModelLengthsWithinContract) {
  const int head_dim = GetParam();
  constexpr int kKv = 2;
  constexpr std::int64_t kMaxCtx = 2100;
  const Geometry g = flat_geometry(kKv, head_dim, head_dim, kMaxCtx);
  Rng rng(0x0DE100u + head_dim);
  ref::KvLayer layer(g);
  append_rows(layer, random_values(rng, kMaxCtx, g.kv_dim_k()),
              random_values(rng, kMaxCtx, g.kv_dim_v()));
  const float scale = ref::default_scale(head_dim);
  for (const int gqa : {1, 16}) {
    ref::KvLayer l = layer;
    const std::vector<float> q = random_query(rng, kKv * gqa, head_dim, 2.0f);
    for (const std::int64_t n :
         {std::int64_t(2100), std::int64_t(1025), std::int64_t(33), std::int64_t(1)}) {
      l.rewind(n);
      const std::vector<double> want = l.decode(q, kKv * gqa, scale);
      for (const int sms : {132, 4, 1}) {
        const auto plan = plan_decode(kKv, head_dim, gqa, kMaxCtx, sms);
        const ref::DecodeView view = reference_view(l);
        expect_within_contract(model_decode(l, q, gqa, scale, view, plan), want, l, q, kKv * gqa,
                               scale, view, plan,
                               "model gqa " + std::to_string(gqa) + " len " + std::to_string(n) +
                                   " splits " + std::to_string(plan.n_splits));
      }
    }
  }
}

// ---- Ring layers: base advances, views start at physical offsets > 0 --------------------------

class DecodeRing : public ::testing::TestWithParam<int> {};

TEST_P(DecodeRing, ViewsFollowTheBase) {
  KVLAYER_REQUIRE_GPU();
  const int head_dim = GetParam();
  constexpr int kKv = 2, kGqa = 8;
  Geometry g = flat_geometry(kKv, head_dim, head_dim, 4000, 300);
  g.storage = Storage::ring;
  g.max_append = 48;
  g.rewind_slack = 5;
  Rng rng(0x816u + head_dim);
  ref::KvLayer layer(g);
  const std::vector<float> q = random_query(rng, kKv * kGqa, head_dim, 2.0f);
  const float scale = ref::default_scale(head_dim);
  const auto plan_real = plan_decode(kKv, head_dim, kGqa, *g.window, device_sm_count());
  const auto plan_long = plan_decode(kKv, head_dim, kGqa, *g.window, 1);
  DecodeBed bed(g, kGqa, plan_real);
  bed.upload_query(q);
  const std::int64_t chunks[] = {1, 7, 48, 33, 2, 31, 32, 17, 48, 5};
  bool saw_offset_view = false;
  for (int i = 0; layer.len() < 1500; ++i) {
    const std::int64_t n = chunks[i % std::size(chunks)];
    append_rows(layer, random_values(rng, n, g.kv_dim_k()), random_values(rng, n, g.kv_dim_v()));
    bed.upload_planes(layer);
    const auto [begin, end] = layer.view();
    saw_offset_view |= begin - layer.base() > 0 && layer.base() > 0;
    for (const auto* p : {&plan_real, &plan_long}) {
      bed.set_plan(*p);
      check_both_modes(bed, layer, q, scale,
                       "ring len " + std::to_string(layer.len()) + " base " +
                           std::to_string(layer.base()) + " splits " + std::to_string(p->n_splits));
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(layer.base(), 0) << "the ring never rebased: the test does not cover base > 0";
  EXPECT_TRUE(saw_offset_view) << "no view started past physical row 0 with base > 0";
}

INSTANTIATE_TEST_SUITE_P(HeadDims, DecodeRing, ::testing::ValuesIn(cuda::kSupportedHeadDims),
                         [](const auto& info) {
                           return std::string("D").append(std::to_string(info.param));
                         });

// ---- Adversarial score distributions ---------------------------------------------------------

/// wide_values is about V, not scores: non-negative blocks with scales up to 2^20, so some
/// dequantized values lie beyond fp16's range (the mma kernel must take those tiles off the
/// tensor cores).
enum class Scores { large_range, dominant_key, tiny_p, increasing, equal_keys, wide_values };

std::string name_of(Scores s) {
  switch (s) {
    case Scores::large_range:
      return "large_range";
    case Scores::dominant_key:
      return "dominant_key";
    case Scores::tiny_p:
      return "tiny_p";
    case Scores::increasing:
      return "increasing";
    case Scores::equal_keys:
      return "equal_keys";
    case Scores::wide_values:
      return "wide_values";
  }
  return "?";
}

/// A flat layer of 3000 keys, 2 KV heads × gqa 8, whose scores follow `kind`.
struct Scenario {
  Geometry g;
  int gqa;
  ref::KvLayer layer;
  std::vector<float> q;
  float scale;
};

Scenario adversarial(int head_dim, Scores kind) {
  constexpr int kKv = 2, kGqa = 8;
  constexpr std::int64_t kKeys = 3000;
  const Geometry g = flat_geometry(kKv, head_dim, head_dim, kKeys);
  Rng rng(0xAD0000u + head_dim * 16 + int(kind));
  const float amplitude = kind == Scores::large_range ? 24.0f : 1.0f;
  std::vector<float> q = random_query(rng, kKv * kGqa, head_dim, amplitude);
  std::vector<float> k =
      random_values(rng, kKeys, g.kv_dim_k(), kind == Scores::large_range ? -2 : -3,
                    kind == Scores::large_range ? 3 : 1);
  std::vector<float> v = kind == Scores::wide_values
                             ? random_values(rng, kKeys, g.kv_dim_v(), -3, 20)
                             : random_values(rng, kKeys, g.kv_dim_v());
  // Non-negative blocks with a zero in each keep q5_1's m (the minimum, 0) and d = max / 31
  // inside fp16 while d·q + m reaches 2^20.
  if (kind == Scores::wide_values) {
    for (float& x : v) x = std::fabs(x);
    for (std::size_t b = 0; b < v.size(); b += 32) v[b] = 0.0f;
  }
  // K of key t, KV head h, from the first query head of h's group: score ≈ factor·√D/3.
  const auto along_q = [&](std::int64_t t, int h, float factor) {
    for (int d = 0; d < head_dim; ++d)
      k[std::size_t(t * g.kv_dim_k() + h * head_dim + d)] =
          factor * q[std::size_t(h * kGqa * head_dim + d)];
  };
  for (int h = 0; h < kKv; ++h) {
    switch (kind) {
      case Scores::large_range:
        break;  // |q| ~ 24, block scales up to 8: scores span hundreds
      case Scores::dominant_key:
        along_q(1234, h, 6.0f);
        break;
      case Scores::tiny_p:
        // Keys near 0, one key ≈ +25 above: every other p is ≈ e^-25, below fp16's subnormals.
        for (std::int64_t t = 0; t < kKeys; ++t)
          for (int d = 0; d < head_dim; ++d)
            k[std::size_t(t * g.kv_dim_k() + h * head_dim + d)] *= 0.01f;
        along_q(2999, h, 75.0f / std::sqrt(float(head_dim)));
        break;
      case Scores::increasing:
        // Scores rise with t: the running max moves in every tile of every split.
        for (std::int64_t t = 0; t < kKeys; ++t) along_q(t, h, 3.0f * float(t + 1) / float(kKeys));
        break;
      case Scores::equal_keys:
        for (std::int64_t t = 0; t < kKeys; ++t) along_q(t, h, 0.5f);
        break;
      case Scores::wide_values:
        break;
    }
  }
  Scenario sc{g, kGqa, ref::KvLayer(g), std::move(q), ref::default_scale(head_dim)};
  append_rows(sc.layer, k, v);
  return sc;
}

class DecodeAdversarial : public ::testing::TestWithParam<std::tuple<int, Scores>> {};

TEST_P(DecodeAdversarial, WithinContract) {
  KVLAYER_REQUIRE_GPU();
  const auto [head_dim, kind] = GetParam();
  const Scenario sc = adversarial(head_dim, kind);
  for (const int sms : {device_sm_count(), 1}) {
    DecodeBed bed(sc.g, sc.gqa, plan_decode(sc.g.n_kv_heads, head_dim, sc.gqa, sc.g.max_ctx, sms));
    bed.upload_planes(sc.layer);
    bed.upload_query(sc.q);
    check_both_modes(bed, sc.layer, sc.q, sc.scale, name_of(kind) + " sms " + std::to_string(sms));
  }
}

/// No GPU needed: the host model of the kernel's rounding points stays within the contract.
TEST_P(DecodeAdversarial, ModelWithinContract) {
  const auto [head_dim, kind] = GetParam();
  const Scenario sc = adversarial(head_dim, kind);
  const int nq = sc.g.n_kv_heads * sc.gqa;
  const std::vector<double> want = sc.layer.decode(sc.q, nq, sc.scale);
  for (const int sms : {132, 1}) {
    const auto plan = plan_decode(sc.g.n_kv_heads, head_dim, sc.gqa, sc.g.max_ctx, sms);
    const ref::DecodeView view = reference_view(sc.layer);
    const double worst = expect_within_contract(
        model_decode(sc.layer, sc.q, sc.gqa, sc.scale, view, plan), want, sc.layer, sc.q, nq,
        sc.scale, view, plan, "model " + name_of(kind) + " sms " + std::to_string(sms));
    RecordProperty("worst_err_over_bound_sms" + std::to_string(sms), std::to_string(worst));
    std::printf("model D%d %s splits %d: worst |err|/bound %.3g\n", head_dim, name_of(kind).c_str(),
                plan.n_splits, worst);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Scores, DecodeAdversarial,
    ::testing::Combine(::testing::ValuesIn(cuda::kSupportedHeadDims),
                       ::testing::Values(Scores::large_range, Scores::dominant_key, Scores::tiny_p,
                                         Scores::increasing, Scores::equal_keys,
                                         Scores::wide_values)),
    [](const auto& info) {
      std::string name("D");  // appends: GCC 12 warns falsely on "D" + std::string at -O3
      name.append(std::to_string(std::get<0>(info.param))).append("_");
      return name.append(name_of(std::get<1>(info.param)));
    });

// ---- Edges: empty views, device overruns, bad blocks, refused launches ------------------------

TEST(DecodeEdge, EmptyViewIsAllZero) {
  KVLAYER_REQUIRE_GPU();
  const Geometry g = flat_geometry(2, 128, 128, 512);
  Rng rng(7);
  ref::KvLayer layer(g);
  append_rows(layer, random_values(rng, 100, g.kv_dim_k()), random_values(rng, 100, g.kv_dim_v()));
  DecodeBed bed(g, 4, plan_decode(2, 128, 4, 512, device_sm_count()));
  bed.upload_planes(layer);
  bed.upload_query(random_query(rng, 8, 128, 1.0f));
  std::vector<float> out;
  ASSERT_EQ(bed.run(bed.host_args(0, 0, 0.1f), out), cudaSuccess);
  for (float x : out) ASSERT_EQ(std::bit_cast<std::uint32_t>(x), 0u) << "host mode";
  bed.set_counters(0, 0);
  ASSERT_EQ(bed.run(bed.device_args(0.1f), out), cudaSuccess);
  for (float x : out) ASSERT_EQ(std::bit_cast<std::uint32_t>(x), 0u) << "device mode";
  EXPECT_EQ(bed.read_status().has_device_error, 0);
}

/// Device-counter launch with counters (len_d, base_d) that must be refused on the device:
/// out stays poisoned and the status holds kind 3 with these values and `limit`.
void expect_device_refusal(DecodeBed& bed, std::int32_t len_d, std::int32_t base_d,
                           std::int64_t limit, const std::string& what) {
  bed.clear_status();
  bed.set_counters(len_d, base_d);
  std::vector<float> out;
  ASSERT_EQ(bed.run(bed.device_args(0.1f), out), cudaSuccess) << what;
  EXPECT_TRUE(untouched(out)) << what << ": out was written";
  const DeviceStatus s = bed.read_status();
  EXPECT_EQ(s.has_device_error, 1) << what;
  EXPECT_EQ(s.device_kind, int(DeviceErrorKind::decode_view_too_long)) << what;
  EXPECT_EQ(s.device_len_d, len_d) << what;
  EXPECT_EQ(s.device_base_d, base_d) << what;
  EXPECT_EQ(s.device_limit, limit) << what;
  EXPECT_EQ(s.has_data_error, 0) << what;
}

TEST(DecodeEdge, DeviceOverrunsWriteNothingAndRecord) {
  KVLAYER_REQUIRE_GPU();
  Rng rng(11);
  {  // Flat: a view longer than the grid was sized for, and len_d past max_ctx.
    const Geometry g = flat_geometry(2, 64, 64, 1024);
    ref::KvLayer layer(g);
    append_rows(layer, random_values(rng, 1024, g.kv_dim_k()),
                random_values(rng, 1024, g.kv_dim_v()));
    DecodeBed bed(g, 2, plan_decode(2, 64, 2, 256, device_sm_count()));
    bed.upload_planes(layer);
    bed.upload_query(random_query(rng, 4, 64, 1.0f));
    expect_device_refusal(bed, 300, 0, 256, "view 300 > grid 256");
    expect_device_refusal(bed, 257, 0, 256, "view 257 > grid 256");
    expect_device_refusal(bed, 1025, 0, 1024, "len_d 1025 > max_ctx 1024");
    // Sticky: a second overrun keeps the first record.
    bed.clear_status();
    bed.set_counters(300, 0);
    std::vector<float> out;
    ASSERT_EQ(bed.run(bed.device_args(0.1f), out), cudaSuccess);
    bed.set_counters(1025, 0);
    ASSERT_EQ(bed.run(bed.device_args(0.1f), out), cudaSuccess);
    EXPECT_EQ(bed.read_status().device_len_d, 300);
    // The exact limit still decodes.
    bed.clear_status();
    bed.set_counters(256, 0);
    ASSERT_EQ(bed.run(bed.device_args(0.1f), out), cudaSuccess);
    EXPECT_FALSE(untouched(out));
    EXPECT_EQ(bed.read_status().has_device_error, 0);
  }
  {  // Ring: views outside the resident rows.
    Geometry g = flat_geometry(2, 128, 128, 4000, 300);
    g.storage = Storage::ring;
    g.max_append = 48;
    g.rewind_slack = 5;
    const std::int64_t rows = g.rows();
    ref::KvLayer layer(g);
    DecodeBed bed(g, 4, plan_decode(2, 128, 4, 300, device_sm_count()));
    bed.upload_query(random_query(rng, 8, 128, 1.0f));
    expect_device_refusal(bed, std::int32_t(64 + rows + 1), 64, rows, "len_d - base_d > rows");
    expect_device_refusal(bed, 300, 256, rows, "view begins below base_d");
    expect_device_refusal(bed, 4001, 3744, 4000, "len_d > max_ctx on a ring");
  }
}

TEST(DecodeEdge, HostModeRefusesBadViewsAndArguments) {
  KVLAYER_REQUIRE_GPU();
  const Geometry g = flat_geometry(1, 256, 256, 512);
  Rng rng(13);
  DecodeBed bed(g, 1, plan_decode(1, 256, 1, 200, device_sm_count()));
  bed.upload_query(random_query(rng, 1, 256, 1.0f));
  std::vector<float> out;
  EXPECT_EQ(bed.run(bed.host_args(201, 0, 0.1f), out), cudaErrorInvalidValue);
  EXPECT_TRUE(untouched(out));
  EXPECT_EQ(bed.run(bed.host_args(513, 0, 0.1f), out), cudaErrorInvalidValue);
  EXPECT_TRUE(untouched(out));
  EXPECT_EQ(bed.run(bed.host_args(-1, 0, 0.1f), out), cudaErrorInvalidValue);
  auto a = bed.host_args(10, 0, 0.1f);
  a.k_plane += 2;  // only 2-byte aligned: the kernel's vector loads need 16
  EXPECT_EQ(bed.run(a, out), cudaErrorInvalidValue);
  EXPECT_TRUE(untouched(out));
  a = bed.device_args(0.1f);
  a.status = nullptr;
  EXPECT_EQ(bed.run(a, out), cudaErrorInvalidValue);
  EXPECT_TRUE(untouched(out));
}

TEST(DecodeEdge, CanonicalBadBlockGivesNaNOnlyWhereAttended) {
  KVLAYER_REQUIRE_GPU();
  constexpr int kKv = 2, kGqa = 4, kD = 128;
  const Geometry g = flat_geometry(kKv, kD, kD, 1000, 40);
  Rng rng(17);
  std::vector<float> k = random_values(rng, 200, g.kv_dim_k());
  std::vector<float> v = random_values(rng, 200, g.kv_dim_v());
  k[std::size_t(10 * g.kv_dim_k() + 1 * kD + 5)] = std::nanf("");  // row 10, KV head 1
  v[std::size_t(100 * g.kv_dim_v() + 0 * kD + 70)] = INFINITY;     // row 100, KV head 0
  ref::KvLayer layer(g);
  append_rows(layer, k, v);
  ASSERT_TRUE(layer.status().data_error.has_value());
  const std::vector<float> q = random_query(rng, kKv * kGqa, kD, 1.0f);
  const float scale = ref::default_scale(kD);
  DecodeBed bed(g, kGqa, plan_decode(kKv, kD, kGqa, 40, device_sm_count()));
  bed.upload_planes(layer);
  bed.upload_query(q);
  const auto nan_heads = [&](std::int64_t len) {
    layer.rewind(len);
    std::vector<float> out;
    EXPECT_EQ(bed.run(bed.host_args(len, 0, scale), out), cudaSuccess);
    const std::vector<double> want = layer.decode(q, kKv * kGqa, scale);
    expect_within_contract(out, want, layer, q, kKv * kGqa, scale, reference_view(layer),
                           bed.plan(), "bad blocks len " + std::to_string(len), false);
    std::vector<bool> nan(kKv * kGqa);
    for (int h = 0; h < kKv * kGqa; ++h)
      for (int e = 0; e < kD; ++e) nan[h] = nan[h] || std::isnan(out[std::size_t(h * kD + e)]);
    return nan;
  };
  // len 150: the view [110, 150) holds neither bad row → all finite.
  for (bool b : nan_heads(150)) EXPECT_FALSE(b);
  // len 120: [80, 120) holds the bad V block of KV head 0 → its query heads are NaN.
  auto n = nan_heads(120);
  for (int h = 0; h < kKv * kGqa; ++h) EXPECT_EQ(n[h], h / kGqa == 0) << "len 120 head " << h;
  // len 30: [0, 30) holds the bad K block of KV head 1.
  n = nan_heads(30);
  for (int h = 0; h < kKv * kGqa; ++h) EXPECT_EQ(n[h], h / kGqa == 1) << "len 30 head " << h;
}

// ---- Determinism and graph replay -----------------------------------------------------------

// ---- The merge: more active splits than one shared-memory chunk -----------------------------

/// The merge stages at most 256 splits' partials at a time (merge.cu, kMergeChunk); a view
/// spread over more splits is summed across chunks, in split order, within the same bound.
TEST(DecodeMerge, ManySplitsAreMergedAcrossChunks) {
  KVLAYER_REQUIRE_GPU();
  using cuda::detail::DecodeKernel;
  constexpr int kKv = 1, kGqa = 2, kD = 128;
  constexpr std::int64_t kKeys = 20000;
  const Geometry g = flat_geometry(kKv, kD, kD, kKeys);
  Rng rng(29);
  ref::KvLayer full(g);
  append_rows(full, random_values(rng, kKeys, g.kv_dim_k()),
              random_values(rng, kKeys, g.kv_dim_v()));
  const std::vector<float> q = random_query(rng, kKv * kGqa, kD, 2.0f);
  const float scale = ref::default_scale(kD);
  for (const DecodeKernel kernel : {DecodeKernel::mma, DecodeKernel::cuda_core}) {
    // Planned for a GPU of 1024 SMs without the split balance: far more splits than one chunk
    // (mma 313 of 64 keys, CUDA cores 625 of 32 keys at 20000 keys: 2 and 3 chunks).
    const auto plan = plan_decode(kKv, kD, kGqa, kKeys, 1024, kernel, 0);
    ASSERT_GT(plan.n_splits, 256) << "the plan no longer spans chunks";
    ref::KvLayer layer = full;
    DecodeBed bed(g, kGqa, plan);
    bed.upload_planes(layer);
    bed.upload_query(q);
    // Descending (rewind only shortens): every split active; just past, at and below 256
    // active splits for the mma plan (16448, 16384) and for the CUDA-core plan (8224, 8192).
    for (const std::int64_t n : {20000, 16448, 16384, 8224, 8192, 1000}) {
      layer.rewind(n);
      const std::int64_t kps =
          cuda::detail::decode_keys_per_split(n, plan.n_splits, plan.tile_keys, plan.split_balance);
      check_both_modes(bed, layer, q, scale,
                       std::string(kernel == DecodeKernel::mma ? "mma" : "cuda_core") + " len " +
                           std::to_string(n) + " active splits " +
                           std::to_string((n + kps - 1) / kps));
      if (HasFailure()) return;
    }
  }
}

TEST(DecodeDeterminism, RepeatedAndReplayedLaunchesAreBitIdentical) {
  KVLAYER_REQUIRE_GPU();
  constexpr int kKv = 2, kGqa = 8, kD = 128;
  constexpr std::int64_t kKeys = 3000;
  const Geometry g = flat_geometry(kKv, kD, kD, kKeys);
  Rng rng(19);
  ref::KvLayer layer(g);
  append_rows(layer, random_values(rng, kKeys, g.kv_dim_k()),
              random_values(rng, kKeys, g.kv_dim_v()));
  const std::vector<float> q = random_query(rng, kKv * kGqa, kD, 2.0f);
  const float scale = ref::default_scale(kD);
  DecodeBed bed(g, kGqa, plan_decode(kKv, kD, kGqa, kKeys, device_sm_count()));
  bed.upload_planes(layer);
  bed.upload_query(q);

  std::vector<float> a, b;
  ASSERT_EQ(bed.run(bed.host_args(kKeys, 0, scale), a), cudaSuccess);
  ASSERT_EQ(bed.run(bed.host_args(kKeys, 0, scale), b), cudaSuccess);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "two host launches differ";

  // Capture one device-counter decode; replay it for several len_d set on the device.
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  bed.set_counters(std::int32_t(kKeys), 0);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const cudaError_t launched =
      cuda::detail::launch_decode(bed.device_args(scale), bed.plan(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(launched, cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (const std::int32_t len : {3000, 2049, 1024, 33, 1, 0}) {
    layer.rewind(len);
    bed.set_counters(len, 0);
    std::vector<float> eager, replayed;
    ASSERT_EQ(bed.run(bed.device_args(scale), eager), cudaSuccess);
    bed.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    replayed = bed.read_out();
    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * 4), 0)
        << "replay differs from eager at len_d " << len;
    expect_within_contract(replayed, layer.decode(q, kKv * kGqa, scale), layer, q, kKv * kGqa,
                           scale, reference_view(layer), bed.plan(),
                           "replay len_d " + std::to_string(len), len > 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace kvlayer::testing
