// The layer's host-side planning (cuda/src/ring_plan.hpp) against the reference on long random
// operation sequences, on the host (no GPU needed): the same placements (rebase, retain, keep,
// write row), the same refusals word for word, the same len and base after every operation.
#include <functional>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "ring_plan.hpp"

namespace kvlayer::testing {
namespace {

namespace d = cuda::detail;

/// (len, base) evolved by ring_plan.hpp alone.
struct Shadow {
  std::int64_t len = 0, base = 0;
};

TEST(RingPlanHost, MatchesReferenceOnRandomSequences) {
  const std::vector<Geometry> geometries = {
      ring(1, 32, 1200, 61, 7, 5),   ring(1, 32, 300, 2, 1, 0),
      ring(1, 32, 2000, 100, 33, 0), ring(1, 32, 800, 63, 2, 1),
      ring(1, 32, 70, 50, 16, 8),    ring(1, 32, 500, 1, 40, 64),
      flat(1, 32, 260, 17),          flat(1, 32, 200)};
  for (const Geometry& g : geometries) {
    SCOPED_TRACE(g.describe());
    Rng rng(0x91A4 ^ std::uint64_t(g.rows()));
    ref::KvLayer ref(g);
    Shadow sh;
    const std::int64_t max_n = g.is_ring() ? g.max_append : 9;
    std::vector<float> zeros(std::size_t(128 * g.kv_dim_k()), 0.0f);  // ≥ the largest n
    int refused = 0, rebased = 0;
    auto both = [&](const std::string& what, const std::function<void()>& on_ref,
                    const std::function<void()>& on_shadow) {
      const std::string want = refusal_of(on_ref);
      const std::string got = refusal_of(on_shadow);
      ASSERT_EQ(got, want) << what;
      refused += !want.empty();
      ASSERT_EQ(sh.len, ref.len()) << what;
      ASSERT_EQ(sh.base, ref.base()) << what;
    };
    for (int i = 0; i < 3000 && !HasFatalFailure(); ++i) {
      switch (rng.range(0, 4)) {
        case 0:
        case 1: {  // append
          const std::int64_t n =
              rng.chance(90) ? rng.range(1, max_n) : rng.range(-1, 2 * max_n + 40);
          if (n >= 1) {
            const d::Placement p = [&] {
              try {
                return d::place_rows(g, sh.len, sh.base, n, "append");
              } catch (const Error&) {
                return d::Placement{false, -1, -1, -1};
              }
            }();
            const ref::AppendPlan want = [&] {
              try {
                return ref.plan_append(n);
              } catch (const Error&) {
                return ref::AppendPlan{false, -1, -1, -1};
              }
            }();
            ASSERT_EQ(p.rebase, want.rebase);
            ASSERT_EQ(p.retain, want.retain);
            ASSERT_EQ(p.keep, want.keep);
            ASSERT_EQ(p.write_row, want.write_row);
            rebased += p.rebase;
          }
          both(
              "append " + std::to_string(n),
              [&] {
                ref.append({zeros.data(), zeros.data(), n, DType::f32});
              },
              [&] {
                const d::Placement p = d::place_rows(g, sh.len, sh.base, n, "append");
                sh.base = p.retain;
                sh.len += n;
              });
          break;
        }
        case 2: {  // rewind
          const std::int64_t slack = g.is_ring() ? g.rewind_slack + 3 : 6;
          const std::int64_t to = sh.len - rng.range(-1, slack + 33);
          ASSERT_EQ(d::rewind_allowed(g, sh.len, sh.base, to), ref.can_rewind_to(to));
          both(
              "rewind " + std::to_string(to), [&] { ref.rewind(to); },
              [&] {
                d::check_rewind(g, sh.len, sh.base, to);
                sh.len = to;
              });
          break;
        }
        case 3:
        case 4: {  // reserve(k), k device-counter steps, account_steps(k')
          const std::int64_t k = rng.range(-1, max_n + 2);
          both(
              "reserve " + std::to_string(k), [&] { ref.reserve(k); },
              [&] {
                if (k < 0) refuse("reserve", "k ", k, " must not be negative");
                if (k == 0) return;
                sh.base = d::place_rows(g, sh.len, sh.base, k, "reserve").retain;
              });
          const std::int64_t steps = std::max<std::int64_t>(k, 0);
          for (std::int64_t s = 0; s < steps; ++s) {
            ref.append_dcw({zeros.data(), zeros.data(), 1, DType::f32});
            ref.inc_seqlen();
          }
          const std::int64_t acc = rng.chance(85) ? steps : steps + rng.range(-1, 3);
          both(
              "account_steps " + std::to_string(acc), [&] { ref.account_steps(acc); },
              [&] {
                d::check_account_steps(g, sh.len, sh.base, acc);
                sh.len += acc;
              });
          if (ref.len() != ref.len_d()) {
            const std::int64_t l = ref.len();
            ref.rewind(l);
          }
          ref.clear_status();
          break;
        }
      }
    }
    EXPECT_GT(refused, 0);
    if (g.is_ring() && g.rows() < g.max_ctx) {
      EXPECT_GT(rebased, 0);
    }
  }
}

}  // namespace
}  // namespace kvlayer::testing
