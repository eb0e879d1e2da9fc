// Long random sequences of host-len and device-counter operations on the GPU layer and the
// reference side by side (SPEC §5–7, §10): after every operation the whole planes, len, base,
// len_d, base_d and status are equal, refusals carry the same message, and a refused request
// leaves the GPU state exactly as it was.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

/// Drives a GPU layer and the reference through the same operations.
class Pair {
 public:
  Pair(const Geometry& g, cudaStream_t s) : g_(g), gpu_(g, g.n_kv_heads, s), ref_(g) {}

  const Geometry& g() const { return g_; }
  cuda::KvLayer& gpu() { return gpu_; }
  ref::KvLayer& ref() { return ref_; }

  /// Runs `on_gpu` and `on_ref`; both must refuse with the same message or both succeed. A
  /// GPU refusal must leave the GPU state untouched. Then the states must be equal.
  void step(const std::string& what, const std::function<void()>& on_gpu,
            const std::function<void()>& on_ref) {
    SCOPED_TRACE(what);
    log_ << what << "\n";
    const Snapshot before = snapshot(gpu_);
    const std::string ref_msg = refusal_of(on_ref);
    const std::string gpu_msg = refusal_of(on_gpu);
    EXPECT_EQ(gpu_msg, ref_msg);
    if (!gpu_msg.empty()) {
      ++refusals_;
      EXPECT_TRUE(same_state(snapshot(gpu_), before, g_)) << "a refused request changed the state";
    }
    ASSERT_TRUE(same_state(gpu_, ref_)) << "operations so far:\n" << log_.str();
  }

  int refusals() const { return refusals_; }

 private:
  Geometry g_;
  cuda::KvLayer gpu_;
  ref::KvLayer ref_;
  std::ostringstream log_;
  int refusals_ = 0;
};

std::string str(const char* op, std::int64_t a) {
  return std::string(op) + "(" + std::to_string(a) + ")";
}

/// One random operation. Sizes straddle every limit so that refusals happen too.
void random_op(Pair& p, Rng& rng) {
  const Geometry& g = p.g();
  const std::int64_t len = p.ref().len();
  const std::int64_t max_n = g.is_ring() ? g.max_append : 9;
  switch (rng.range(0, 9)) {
    case 0:
    case 1:
    case 2: {  // host-len append, sometimes too big
      const std::int64_t n = rng.chance(90) ? rng.range(1, max_n) : rng.range(0, 2 * max_n + 40);
      const HostRows rows = make_rows(g, std::max<std::int64_t>(n, 1), kDTypes[rng.range(0, 2)],
                                      rng.chance(80) ? Fill::random : Fill::adversarial, rng);
      const DeviceRows drows(rows);
      cuda::RowsView dv = drows.view;
      ref::RowsView hv = rows.view();
      dv.n = hv.n = n;
      p.step(
          str("append", n), [&] { p.gpu().append(dv); }, [&] { p.ref().append(hv); });
      break;
    }
    case 3: {  // rewind, around the ring's limit
      const std::int64_t slack = g.is_ring() ? g.rewind_slack + 3 : 6;
      // Mostly short rewinds (like rejected speculative tokens), so that rings with a small
      // max_append still grow past their rows and rebase; sometimes far, to the ring's limit.
      const std::int64_t reach = rng.chance(30) ? slack + 33 : max_n + 1;
      const std::int64_t to = std::max<std::int64_t>(-1, len - rng.range(-1, reach));
      const bool can = p.gpu().can_rewind_to(to);
      EXPECT_EQ(can, p.ref().can_rewind_to(to)) << "can_rewind_to(" << to << ")";
      p.step(
          str("rewind", to), [&] { p.gpu().rewind(to); }, [&] { p.ref().rewind(to); });
      break;
    }
    case 4: {  // reserve
      const std::int64_t k = rng.range(-1, max_n + 3);
      p.step(
          str("reserve", k), [&] { p.gpu().reserve(k); }, [&] { p.ref().reserve(k); });
      break;
    }
    case 5:
    case 6:
    case 7: {  // a chain of k device-counter steps, reserved first
      const std::int64_t k = rng.range(1, max_n);
      p.step(
          str("reserve", k), [&] { p.gpu().reserve(k); }, [&] { p.ref().reserve(k); });
      const bool dcw = g.is_ring() || rng.chance(50);
      for (std::int64_t i = 0; i < k; ++i) {
        const HostRows rows = make_rows(g, 1, kDTypes[rng.range(0, 2)], Fill::random, rng);
        const DeviceRows drows(rows);
        if (dcw)
          p.step(
              "append_dcw", [&] { p.gpu().append_dcw(drows.view); },
              [&] { p.ref().append_dcw(rows.view()); });
        else
          p.step(
              "append_dc", [&] { p.gpu().append_dc(drows.view); },
              [&] { p.ref().append_dc(rows.view()); });
        p.step(
            "inc_seqlen", [&] { p.gpu().inc_seqlen(); }, [&] { p.ref().inc_seqlen(); });
      }
      // Only what was really stepped: after a refused reserve len_d overran, account anyway
      // (the device error is recorded on both sides, len stays bounded by max_ctx).
      const std::int64_t acc = std::min(k, g.max_ctx - p.ref().len());
      p.step(
          str("account_steps", acc), [&] { p.gpu().account_steps(acc); },
          [&] { p.ref().account_steps(acc); });
      if (p.ref().len() != p.ref().len_d()) {  // resynchronise len_d after an overrun
        const std::int64_t l = p.ref().len();
        p.step(
            str("rewind", l), [&] { p.gpu().rewind(l); }, [&] { p.ref().rewind(l); });
      }
      break;
    }
    case 8: {  // physical_rows and can_rewind_to, pure queries
      const std::int64_t start = len - rng.range(0, g.rows() + 3);
      const std::int64_t end = start + rng.range(-1, g.rows() + 2);
      std::pair<std::int64_t, std::int64_t> a{-7, -7}, b{-7, -7};
      p.step(
          "physical_rows(" + std::to_string(start) + ", " + std::to_string(end) + ")",
          [&] { a = p.gpu().physical_rows(start, end); },
          [&] { b = p.ref().physical_rows(start, end); });
      EXPECT_EQ(a, b);
      for (std::int64_t q = len - 40; q <= len + 1; ++q)
        EXPECT_EQ(p.gpu().can_rewind_to(q), p.ref().can_rewind_to(q)) << "can_rewind_to " << q;
      EXPECT_EQ(p.gpu().view(), p.ref().view());
      break;
    }
    case 9: {  // status round trip
      p.step(
          "clear_status", [&] { p.gpu().clear_status(); }, [&] { p.ref().clear_status(); });
      break;
    }
  }
}

struct Case {
  const char* name;
  Geometry g;
  int ops;
};

std::vector<Case> cases() {
  return {
      {"ring w61 a7 s5", ring(2, 64, 1200, 61, 7, 5), 700},
      {"ring w2 a1 s0", ring(1, 64, 300, 2, 1, 0), 500},
      {"ring w100 a33 s0", ring(1, 128, 2000, 100, 33, 0), 500},
      {"ring w63 a2 s1", ring(3, 64, 800, 63, 2, 1), 900},
      {"ring capped by max_ctx", ring(1, 64, 70, 50, 16, 8), 300},
      {"flat window 17", flat(2, 64, 260, 17), 300},
      {"flat", flat(1, 256, 200), 300},
  };
}

TEST(CudaRing, RandomOperationSequencesMatchReference) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Rng rng(0xC0FFEE ^ std::hash<std::string>{}(c.name));
    Pair p(c.g, stream.get());
    std::int64_t max_base = 0;
    for (int i = 0; i < c.ops && !::testing::Test::HasFatalFailure(); ++i) {
      random_op(p, rng);
      max_base = std::max(max_base, p.ref().base());
    }
    if (c.g.is_ring() && c.g.rows() < c.g.max_ctx) {
      EXPECT_GT(max_base, 0) << "the sequence never rebased";
    }
    EXPECT_GT(p.refusals(), 0) << "the sequence never hit a limit";
  }
}

/// The boundary points FIELD-NOTES lists: len = window−1, window, window+1, exact fullness, and
/// rewinds exactly at the limit, with single-row appends that force a rebase at each.
TEST(CudaRing, WindowBoundariesAndRewindLimits) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xB0D);
  for (const Geometry& g : {ring(1, 64, 400, 61, 1, 3), ring(2, 64, 400, 32, 4, 0)}) {
    SCOPED_TRACE(g.describe());
    Pair p(g, stream.get());
    auto append = [&](std::int64_t n) {
      const HostRows rows = make_rows(g, n, DType::f32, Fill::random, rng);
      const DeviceRows drows(rows);
      p.step(
          str("append", n), [&] { p.gpu().append(drows.view); },
          [&] { p.ref().append(rows.view()); });
    };
    // Fill to window − 1, window, window + 1, then to exact fullness of the plane.
    append(*g.window - 1);
    append(1);
    append(1);
    while (p.ref().len() - p.ref().base() < g.rows()) append(1);
    // The next append must rebase; rewinding exactly to the limit and one below.
    append(1);
    ASSERT_GT(p.ref().base(), 0);
    for (int round = 0; round < 20; ++round) {
      std::int64_t lowest = p.ref().len();
      while (lowest > 0 && p.ref().can_rewind_to(lowest - 1)) --lowest;
      p.step(
          str("rewind", lowest - 1), [&] { p.gpu().rewind(lowest - 1); },
          [&] { p.ref().rewind(lowest - 1); });  // refused on both
      p.step(
          str("rewind", lowest), [&] { p.gpu().rewind(lowest); }, [&] { p.ref().rewind(lowest); });
      for (int i = 0; i < 1 + round % 5; ++i)
        append(std::min<std::int64_t>(g.max_append, 1 + i % 3));
    }
  }
}

}  // namespace
}  // namespace kvlayer::testing
