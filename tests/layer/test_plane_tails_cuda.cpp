// The kPlaneTailBytes zero bytes past each plane's last row (SPEC §1: kernels may load past a
// row's end, never store there) stay zero through random sequences of every operation: host
// appends that fill the last physical row, bad blocks, ring rebases, rewinds, device-counter
// steps and decodes of each variant; the state equals the reference's after every operation.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

::testing::AssertionResult tails_zero(const cuda::KvLayer& l) {
  for (const bool k : {true, false}) {
    const std::vector<std::uint8_t> t = k ? l.k_plane_tail_bytes() : l.v_plane_tail_bytes();
    if (t.size() != cuda::kPlaneTailBytes)
      return ::testing::AssertionFailure() << (k ? "K" : "V") << " tail has " << t.size()
                                           << " bytes, expected " << cuda::kPlaneTailBytes;
    const auto nz = std::find_if(t.begin(), t.end(), [](std::uint8_t b) { return b != 0; });
    if (nz != t.end())
      return ::testing::AssertionFailure()
             << (k ? "K" : "V") << " tail byte " << (nz - t.begin()) << " is 0x" << std::hex
             << int(*nz) << " (written past the plane's last row)";
  }
  return ::testing::AssertionSuccess();
}

struct TailCase {
  Geometry g;
  int gqa;
};

void run_case(const TailCase& c, std::uint64_t seed) {
  const Geometry& g = c.g;
  SCOPED_TRACE(g.describe());
  const int nq = g.n_kv_heads * c.gqa;
  Stream stream;
  const cudaStream_t s = stream.get();
  Rng rng(seed);
  cuda::KvLayer gpu(g, nq, s);
  ref::KvLayer ref(g);
  ASSERT_TRUE(tails_zero(gpu)) << "at construction";
  DeviceFloats q(std::size_t(nq) * g.head_dim_k), out(std::size_t(nq) * g.head_dim_v);
  const std::int64_t max_n = g.is_ring() ? g.max_append : 40;
  bool filled_last_row = false;
  int rebases = 0, rewinds = 0, decodes = 0, dc_steps = 0;

  const auto check = [&](const std::string& what) {
    ASSERT_TRUE(tails_zero(gpu)) << "after " << what;
    ASSERT_TRUE(same_state(gpu, ref)) << "after " << what;
    if (ref.len() - ref.base() == g.rows()) filled_last_row = true;
  };
  // Whether an append (or reserve) of n rows would be accepted (the reference refuses what the
  // ring cannot fit).
  const auto fits = [&](std::int64_t n) {
    try {
      (void)ref.plan_append(n);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  const auto append = [&](std::int64_t n, Fill fill) {
    const std::int64_t base = ref.base();
    const HostRows rows = make_rows(g, n, kDTypes[rng.range(0, 2)], fill, rng);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
    rebases += ref.base() != base;
    check("append(" + std::to_string(n) + ")");
  };

  for (int op = 0; op < 160 && !::testing::Test::HasFatalFailure(); ++op) {
    const std::int64_t len = ref.len(), used = len - ref.base();
    const std::int64_t room = g.max_ctx - len;
    switch (rng.range(0, 5)) {
      case 0:
      case 1: {  // a host append; often exactly up to the last physical row
        if (room < 1) break;
        std::int64_t n = std::min(room, rng.range(1, max_n));
        const std::int64_t to_last = g.rows() - used;
        if (to_last >= 1 && to_last <= std::min(room, max_n) && rng.chance(50)) n = to_last;
        if (!fits(n)) break;
        append(n, rng.chance(30) ? Fill::adversarial : Fill::random);
        break;
      }
      case 2: {  // a short rewind (rejected speculative tokens)
        const std::int64_t to = std::max<std::int64_t>(0, len - rng.range(1, 6));
        if (!ref.can_rewind_to(to)) break;
        gpu.rewind(to);
        ref.rewind(to);
        ++rewinds;
        check("rewind(" + std::to_string(to) + ")");
        break;
      }
      case 3: {  // a chain of device-counter steps, reserved first
        const std::int64_t k = std::min(room, rng.range(1, std::min<std::int64_t>(max_n, 8)));
        if (k < 1 || !fits(k)) break;
        const std::int64_t base = ref.base();
        gpu.reserve(k);
        ref.reserve(k);
        rebases += ref.base() != base;
        check("reserve(" + std::to_string(k) + ")");
        const bool dcw = g.is_ring() || rng.chance(50);
        for (std::int64_t i = 0; i < k; ++i) {
          const HostRows rows = make_rows(g, 1, kDTypes[rng.range(0, 2)], Fill::adversarial, rng);
          const DeviceRows d(rows);
          if (dcw) {
            gpu.append_dcw(d.view);
            ref.append_dcw(rows.view());
          } else {
            gpu.append_dc(d.view);
            ref.append_dc(rows.view());
          }
          gpu.inc_seqlen();
          ref.inc_seqlen();
          ++dc_steps;
          check(dcw ? "append_dcw + inc_seqlen" : "append_dc + inc_seqlen");
        }
        gpu.account_steps(k);
        ref.account_steps(k);
        check("account_steps(" + std::to_string(k) + ")");
        break;
      }
      case 4:
      case 5: {  // a decode of each applicable variant (reads only: the tails must not change)
        std::vector<float> hq(q.count);
        for (float& x : hq) x = rng.uniform(-2, 2);
        q.upload(hq);
        // Not right after a rewind to the ring's limit: the view would start below base (refused
        // on the host, recorded as a device error by decode_dcw).
        if (gpu.view().first < gpu.base()) break;
        gpu.decode(q.get(), out.get());
        if (g.window)
          gpu.decode_dcw(q.get(), out.get());
        else
          gpu.decode_dc(q.get(), out.get());
        ++decodes;
        ASSERT_TRUE(tails_zero(gpu)) << "after a decode";
        break;
      }
    }
    // A flat layer is filled to max_ctx once, at the end of the sequence: the last row written.
    if (!g.is_ring() && op == 150 && ref.len() < g.max_ctx)
      append(g.max_ctx - ref.len(), Fill::adversarial);
  }
  EXPECT_TRUE(filled_last_row) << "no operation filled the last physical row";
  EXPECT_GT(decodes, 0);
  EXPECT_GT(dc_steps, 0);
  EXPECT_GT(rewinds, 0);
  if (g.is_ring()) {
    EXPECT_GT(rebases, 0);
  }
}

TEST(CudaPlaneTails, StayZeroThroughEveryOperation) {
  KVLAYER_REQUIRE_GPU();
  // Odd token sizes (K 68·n_kv, V 48·n_kv bytes) so that rows end off any 16-byte boundary.
  const std::vector<TailCase> cases = {
      {flat(1, 64, 97), 1},
      {flat(3, 128, 200), 4},
      {flat(2, 256, 150, 37), 2},
      {ring(1, 64, 4000, 50, 16, 3), 8},
      {ring(3, 128, 4000, 70, 9, 5), 2},
      {ring(2, 256, 4000, 33, 32, 0), 16},
  };
  std::uint64_t seed = 0x7A11;
  for (const TailCase& c : cases) run_case(c, seed++);
}

}  // namespace
}  // namespace kvlayer::testing
