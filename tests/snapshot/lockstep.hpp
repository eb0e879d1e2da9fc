// Two reference layers driven in lock step: the original and its restored copy receive the same
// random commands (appends, rewinds, device-counter chains, multi-row steps, host decodes and
// verify decodes), and after every command they must hold the same len, len_d and logical rows
// and return bit-identical decodes (SPEC §13: "every operation behaves as on the original").
// The one allowed difference: a restored ring refuses a rewind, or a host decode, that needs a
// row below its base (its first row), which the original may still hold.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "snapshot/snapshot_testbed.hpp"
#include "testbed.hpp"

namespace kvlayer::testing {

/// What a lock-step run did, for a test to check that it was not vacuous.
struct LockstepCounts {
  int appends = 0, rewinds = 0, refused_rewinds = 0, chains = 0, decodes = 0, verifies = 0;
};

/// T query rows of a verify decode: [T, n_q_heads, head_dim_k].
inline std::vector<float> query_rows(const Geometry& g, int n_q_heads, std::int64_t t, Rng& rng) {
  std::vector<float> q;
  for (std::int64_t i = 0; i < t; ++i) {
    const std::vector<float> row = random_query(g, n_q_heads, rng);
    q.insert(q.end(), row.begin(), row.end());
  }
  return q;
}

/// Runs `steps` random commands on `a` (the original) and `b` (restored from it); returns "" or
/// the first difference, naming the command.
inline std::string lockstep(KvLayer& a, KvLayer& b, Rng& rng, int steps,
                            LockstepCounts* counts = nullptr) {
  LockstepCounts local;
  LockstepCounts& c = counts != nullptr ? *counts : local;
  const Geometry& g = a.geometry();
  const bool windowed = g.window.has_value();
  const int nq = g.n_kv_heads * 2;
  const std::int64_t max_n = g.is_ring() ? g.max_append : 8;
  auto decodable = [](const KvLayer& l) { return l.view().first >= l.base(); };
  for (int step = 0; step < steps; ++step) {
    std::ostringstream what;
    const std::int64_t room = g.max_ctx - a.len();
    switch (rng.range(0, 5)) {
      case 0: {  // a host append
        if (room < 1) break;
        const std::int64_t n = rng.range(1, std::min(max_n, room));
        const HostRows r = random_rows(g, n, rng);
        a.append(r.f32_view());
        b.append(r.f32_view());
        what << "append(" << n << ")";
        ++c.appends;
        break;
      }
      case 1: {  // a rewind, sometimes deeper than the restored ring allows
        // Mostly shallow (speculative) rewinds, so that the layers grow; now and then a deep one.
        const std::int64_t deepest = rng.chance(80) ? 8 : 48;
        const std::int64_t p = a.len() - rng.range(0, std::min(a.len(), deepest));
        what << "rewind(" << p << ")";
        const bool on_a = a.can_rewind_to(p), on_b = b.can_rewind_to(p);
        if (on_a && on_b) {
          a.rewind(p);
          b.rewind(p);
          ++c.rewinds;
        } else if (on_b) {
          return what.str() + ": refused by the original only";
        } else if (on_a) {
          // SPEC §13's one exception: the copy dropped the rows below its first row.
          if (plan_first(g, p) >= b.base())
            return what.str() + ": refused by the restored layer although logical row " +
                   std::to_string(plan_first(g, p)) + " is resident (base " +
                   std::to_string(b.base()) + ")";
          ++c.refused_rewinds;  // neither layer moves
        }
        break;
      }
      case 2:
      case 3: {  // a device-counter chain of k steps of T rows (reserve, steps, account_steps)
        const bool rows_step = rng.chance(50);
        const std::int64_t t = rows_step ? rng.range(1, std::min<std::int64_t>(4, max_n)) : 1;
        const std::int64_t k = rng.range(1, std::max<std::int64_t>(1, max_n / t)) * t;
        if (k > room) break;
        a.reserve(k);
        b.reserve(k);
        for (std::int64_t done = 0; done < k; done += t) {
          const HostRows r = random_rows(g, t, rng);
          const std::vector<float> q = query_rows(g, nq, t, rng);
          std::optional<std::vector<double>> out[2];
          int i = 0;
          for (KvLayer* l : {&a, &b}) {
            if (rows_step) {
              windowed ? l->append_rows_dcw(r.f32_view()) : l->append_rows_dc(r.f32_view());
              l->inc_seqlen(int(t));
              out[i++] =
                  windowed ? l->decode_rows_dcw(q, nq, int(t)) : l->decode_rows_dc(q, nq, int(t));
            } else {
              windowed ? l->append_dcw(r.f32_view()) : l->append_dc(r.f32_view());
              l->inc_seqlen();
              out[i++] = windowed ? l->decode_dcw(q, nq) : l->decode_dc(q, nq);
            }
          }
          if (!out[0] || out[0] != out[1])
            return "device-counter chain of k " + std::to_string(k) + " T " + std::to_string(t) +
                   ": decode at step " + std::to_string(done) + " differs or was not served";
        }
        a.account_steps(k);
        b.account_steps(k);
        what << "device chain k " << k << " T " << t;
        ++c.chains;
        break;
      }
      case 4: {  // a host decode
        what << "decode at len " << a.len();
        if (!decodable(a) || !decodable(b)) break;
        const std::vector<float> q = random_query(g, nq, rng);
        if (a.decode(q, nq) != b.decode(q, nq)) return what.str() + ": outputs differ";
        ++c.decodes;
        break;
      }
      case 5: {  // a host verify decode of T rows
        const int t = int(rng.range(1, 4));
        what << "decode_rows(T " << t << ") at len " << a.len();
        if (a.len() < t) break;
        const std::int64_t s0 =
            windowed ? std::max<std::int64_t>(0, a.len() - t + 1 - *g.window) : 0;
        if (s0 < a.base() || s0 < b.base()) break;
        const std::vector<float> q = query_rows(g, nq, t, rng);
        if (a.decode_rows(q, nq, t) != b.decode_rows(q, nq, t))
          return what.str() + ": outputs differ";
        ++c.verifies;
        break;
      }
    }
    if (std::string d = logical_diff(a, b); !d.empty()) return "after " + what.str() + ": " + d;
    if (b.base_d() != b.base() || a.base_d() != a.base())
      return "after " + what.str() + ": base_d differs from base";
    if (!b.status().ok()) return "after " + what.str() + ": " + b.status().message();
  }
  return "";
}

}  // namespace kvlayer::testing
