// Every refused request (SPEC §9): the exact message (operation, offending values, limit), kind
// `refused`, and a state identical to before in every byte and counter. Each refusal is tried
// on layers with non-trivial state: rows written, a ring with base > 0, and a layer whose status
// already holds errors (so a refusal that recorded or cleared anything would show).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

using std::to_string;

// ---- geometry ----------------------------------------------------------------------------------

struct GeometryCase {
  const char* what;
  std::function<void(Geometry&)> mutate;
  std::string message;
};

TEST(Refusals, EveryIllegalGeometryFieldIsNamedWithItsLimit) {
  const std::string i32max = to_string(std::numeric_limits<std::int32_t>::max());
  const std::vector<GeometryCase> cases = {
      {"heads 0", [](Geometry& g) { g.n_kv_heads = 0; },
       "geometry: n_kv_heads 0 is outside [1, 4096]"},
      {"heads 4097", [](Geometry& g) { g.n_kv_heads = 4097; },
       "geometry: n_kv_heads 4097 is outside [1, 4096]"},
      {"hdk 0", [](Geometry& g) { g.head_dim_k = 0; },
       "geometry: head_dim_k 0 must be a positive multiple of 32 up to 4096"},
      {"hdk 48", [](Geometry& g) { g.head_dim_k = 48; },
       "geometry: head_dim_k 48 must be a positive multiple of 32 up to 4096"},
      {"hdk -32", [](Geometry& g) { g.head_dim_k = -32; },
       "geometry: head_dim_k -32 must be a positive multiple of 32 up to 4096"},
      {"hdk 4128", [](Geometry& g) { g.head_dim_k = 4128; },
       "geometry: head_dim_k 4128 must be a positive multiple of 32 up to 4096"},
      {"hdv 16", [](Geometry& g) { g.head_dim_v = 16; },
       "geometry: head_dim_v 16 must be a positive multiple of 32 up to 4096"},
      {"hdv 33", [](Geometry& g) { g.head_dim_v = 33; },
       "geometry: head_dim_v 33 must be a positive multiple of 32 up to 4096"},
      {"max_ctx 0", [](Geometry& g) { g.max_ctx = 0; },
       "geometry: max_ctx 0 is outside [1, " + i32max + "] (device counters are int32)"},
      {"max_ctx 2^31", [](Geometry& g) { g.max_ctx = std::int64_t(1) << 31; },
       "geometry: max_ctx 2147483648 is outside [1, " + i32max + "] (device counters are int32)"},
      {"window 0", [](Geometry& g) { g.window = 0; },
       "geometry: window 0 is outside [1, " + i32max + "]"},
      {"window -5", [](Geometry& g) { g.window = -5; },
       "geometry: window -5 is outside [1, " + i32max + "]"},
      {"window 2^31", [](Geometry& g) { g.window = std::int64_t(1) << 31; },
       "geometry: window 2147483648 is outside [1, " + i32max + "]"},
      {"ring without window",
       [](Geometry& g) {
         g.storage = Storage::ring;
         g.window.reset();
       },
       "geometry: ring storage requires a window"},
      {"ring max_append 0",
       [](Geometry& g) {
         g.storage = Storage::ring;
         g.window = 8;
         g.max_append = 0;
       },
       "geometry: max_append 0 is outside [1, " + i32max + "]"},
      {"ring rewind_slack -1",
       [](Geometry& g) {
         g.storage = Storage::ring;
         g.window = 8;
         g.rewind_slack = -1;
       },
       "geometry: rewind_slack -1 is outside [0, " + i32max + "]"},
      {"first illegal field wins",
       [](Geometry& g) {
         g.n_kv_heads = 0;
         g.head_dim_v = 7;
       },
       "geometry: n_kv_heads 0 is outside [1, 4096]"},
  };
  for (const auto& c : cases) {
    Geometry g = flat_geometry(2, 32, 64, 16);
    c.mutate(g);
    EXPECT_EQ(check_throws_refused([&] { g.validate(); }, c.message), "") << c.what;
    EXPECT_EQ(check_throws_refused([&] { KvLayer l(g); }, c.message), "") << c.what;
  }
}

TEST(Refusals, LegalGeometryEdgesValidate) {
  Geometry g = flat_geometry(4096, 4096, 32, std::numeric_limits<std::int32_t>::max(),
                             std::numeric_limits<std::int32_t>::max());
  EXPECT_NO_THROW(g.validate());
  // Ring-only fields are not checked on a flat layer.
  Geometry f = flat_geometry(1, 32, 32, 4);
  f.max_append = 0;
  f.rewind_slack = -1;
  EXPECT_NO_THROW(KvLayer{f});
  Geometry r = ring_geometry(1, 32, 32, 4, 1, 1, 0);
  EXPECT_NO_THROW(KvLayer{r});
}

// ---- layer operations --------------------------------------------------------------------------

/// Layers in non-trivial states for the refusals below.
struct Layers {
  Geometry flat_g = flat_geometry(2, 32, 64, 16);
  Geometry windowed_g = flat_geometry(2, 32, 64, 16, 3);
  Geometry ring_g = ring_geometry(2, 32, 64, 1000, 61, 5, 3);  // rows 100
  KvLayer flat{flat_g}, dirty{flat_g}, windowed{windowed_g}, ring{ring_g};
  Rng rng{0x4EF};

  Layers() {
    flat.append(random_rows(flat_g, 5, rng).f32_view());
    // dirty: a data error and a device error already recorded, len_d ahead of len.
    HostRows bad = random_rows(flat_g, 4, rng);
    bad.v[std::size_t(2 * flat_g.kv_dim_v() + 70)] = NAN;
    dirty.append(bad.f32_view());
    for (int i = 0; i < 13; ++i) dirty.inc_seqlen();
    dirty.append_dc(random_rows(flat_g, 1, rng).f32_view());  // len_d 17 ≥ max_ctx: device error
    windowed.append(random_rows(windowed_g, 7, rng).f32_view());
    for (int i = 0; i < 101; ++i) ring.append(random_rows(ring_g, 1, rng).f32_view());
  }
  std::vector<KvLayer*> flats() { return {&flat, &dirty, &windowed}; }
  std::vector<KvLayer*> all() { return {&flat, &dirty, &windowed, &ring}; }
};

TEST(Refusals, TheLayersUnderTestAreNonTrivial) {
  Layers ls;
  EXPECT_TRUE(ls.dirty.status().data_error && ls.dirty.status().device_error);
  EXPECT_EQ(ls.dirty.len_d(), 17);
  EXPECT_EQ(ls.ring.base(), 32);
  EXPECT_EQ(ls.flat.len(), 5);
}

TEST(Refusals, Append) {
  Layers ls;
  for (KvLayer* l : ls.all()) {
    const Geometry& g = l->geometry();
    const HostRows r = random_rows(g, 2, ls.rng);
    auto with = [&](const void* k, const void* v, std::int64_t n) {
      return [l, k, v, n] { l->append({k, v, n, DType::f32}); };
    };
    expect_refused_unchanged(*l, with(r.k.data(), r.v.data(), 0), "append: n 0 must be at least 1");
    expect_refused_unchanged(*l, with(r.k.data(), r.v.data(), -3),
                             "append: n -3 must be at least 1");
    expect_refused_unchanged(*l, with(nullptr, r.v.data(), 2), "append: k and v must not be null");
    expect_refused_unchanged(*l, with(r.k.data(), nullptr, 2), "append: k and v must not be null");
    const std::int64_t over = g.max_ctx - l->len() + 1;
    const HostRows big = random_rows(g, over, ls.rng);
    expect_refused_unchanged(*l, with(big.k.data(), big.v.data(), over),
                             "append: len " + to_string(l->len()) + " + n " + to_string(over) +
                                 " exceeds max_ctx " + to_string(g.max_ctx));
    expect_refused_unchanged(
        *l, [&] { (void)l->plan_append(0, "reserve"); }, "reserve: n 0 must be at least 1");
  }
}

/// SPEC §3: inputs are f32, f16 or bf16; §5/§9: an input that does not match is refused with
/// the state unchanged. The message is the CUDA layer's (cuda/src/kv_layer.cpp check_rows), so
/// that both layers refuse the same request with the same words.
TEST(Refusals, UnknownInputDtype) {
  Layers ls;
  for (KvLayer* l : {&ls.flat, &ls.ring}) {
    const HostRows r = random_rows(l->geometry(), 1, ls.rng);
    const kvlayer::ref::RowsView bad{r.k.data(), r.v.data(), 1, static_cast<DType>(7)};
    expect_refused_unchanged(
        *l, [&] { l->append(bad); }, "append: dtype 7 is not f32, f16 or bf16");
    expect_refused_unchanged(
        *l, [&] { l->append_dcw(bad); }, "append_dcw: dtype 7 is not f32, f16 or bf16");
  }
  const HostRows r = random_rows(ls.flat_g, 1, ls.rng);
  expect_refused_unchanged(
      ls.flat,
      [&] {
        ls.flat.append_dc({r.k.data(), r.v.data(), 1, static_cast<DType>(3)});
      },
      "append_dc: dtype 3 is not f32, f16 or bf16");
}

TEST(Refusals, Rewind) {
  Layers ls;
  for (KvLayer* l : ls.all()) {
    const std::string len = to_string(l->len());
    expect_refused_unchanged(
        *l, [&] { l->rewind(l->len() + 1); },
        "rewind: new_len " + to_string(l->len() + 1) + " is outside [0, len " + len + "]");
    expect_refused_unchanged(
        *l, [&] { l->rewind(-1); }, "rewind: new_len -1 is outside [0, len " + len + "]");
  }
  expect_refused_unchanged(
      ls.ring, [&] { ls.ring.rewind(0); },
      "rewind: new_len 0 needs logical row 0 resident (the window of the next append), below "
      "base 32 (the ring already dropped "
      "it)");
}

TEST(Refusals, Reserve) {
  Layers ls;
  for (KvLayer* l : ls.all()) {
    expect_refused_unchanged(
        *l, [&] { l->reserve(-2); }, "reserve: k -2 must not be negative");
    const std::int64_t over = l->geometry().max_ctx - l->len() + 1;
    expect_refused_unchanged(
        *l, [&] { l->reserve(over); },
        "reserve: len " + to_string(l->len()) + " + n " + to_string(over) + " exceeds max_ctx " +
            to_string(l->geometry().max_ctx));
  }
  // base 32, len 101: retain align_down(38) = 32 = base, keep 69: 69 + 32 > 100.
  expect_refused_unchanged(
      ls.ring, [&] { ls.ring.reserve(32); },
      "reserve: ring cannot fit n 32 rows: 69 rows must stay resident (from logical row 32) and "
      "69 + 32 exceeds rows 100");
}

TEST(Refusals, DeviceCounterAppends) {
  Layers ls;
  for (KvLayer* l : ls.all()) {
    const HostRows r = random_rows(l->geometry(), 2, ls.rng);
    for (const char* op : {"append_dc", "append_dcw"}) {
      const bool dc = op == std::string("append_dc");
      auto call = [l, dc](const void* k, const void* v, std::int64_t n) {
        return [=] {
          if (dc)
            l->append_dc({k, v, n, DType::f32});
          else
            l->append_dcw({k, v, n, DType::f32});
        };
      };
      const std::string o = op;
      expect_refused_unchanged(*l, call(nullptr, r.v.data(), 1), o + ": k and v must not be null");
      expect_refused_unchanged(*l, call(r.k.data(), nullptr, 1), o + ": k and v must not be null");
      expect_refused_unchanged(*l, call(r.k.data(), r.v.data(), 0), o + ": n 0 must be at least 1");
      expect_refused_unchanged(*l, call(r.k.data(), r.v.data(), 2), o + ": n 2 must be 1");
    }
  }
  const HostRows r = random_rows(ls.ring_g, 1, ls.rng);
  expect_refused_unchanged(
      ls.ring, [&] { ls.ring.append_dc(r.f32_view()); }, "append_dc: ring layers use append_dcw");
}

TEST(Refusals, AccountSteps) {
  Layers ls;
  for (KvLayer* l : ls.all()) {
    const std::string head = "account_steps: len " + to_string(l->len()) + " + k ";
    const std::string tail = " is outside [len, max_ctx " + to_string(l->geometry().max_ctx) + "]";
    expect_refused_unchanged(
        *l, [&] { l->account_steps(-1); }, head + "-1" + tail);
    const std::int64_t over = l->geometry().max_ctx - l->len() + 1;
    expect_refused_unchanged(
        *l, [&] { l->account_steps(over); }, head + to_string(over) + tail);
  }
}

/// SPEC §6: "Invariant: base ≤ len and len − base ≤ rows." account_steps is the only host call
/// that moves len forward without planning, so it must refuse a k that breaks the invariant
/// (the host knows len, base and rows without a sync). Otherwise the next append plans a rebase
/// that copies rows from past the end of the plane.
TEST(Refusals, AccountStepsThatWouldBreakTheRingInvariant) {
  const Geometry g = ring_geometry(1, 32, 32, 1000, 61, 5, 3);  // rows 100
  KvLayer l(g);
  Rng rng(0xACC);
  l.append(random_rows(g, 100, rng).f32_view());  // len − base == rows
  l.inc_seqlen();                             // a step beyond its headroom ...
  expect_refused_unchanged(
      l, [&] { l.account_steps(1); },  // ... would make len − base 101
      "account_steps: len 100 + k 1 - base 0 exceeds rows 100 (more steps "
      "than reserve() made room for)");
}

TEST(Refusals, PhysicalRows) {
  Layers ls;
  for (KvLayer* l : ls.all()) {
    const std::int64_t b = l->base(), e = l->base() + l->rows();
    const std::string lim =
        " is not within the resident rows [" + to_string(b) + ", " + to_string(e) + ")";
    expect_refused_unchanged(
        *l, [&] { (void)l->physical_rows(b, e + 1); },
        "physical_rows: [" + to_string(b) + ", " + to_string(e + 1) + ")" + lim);
    expect_refused_unchanged(
        *l, [&] { (void)l->physical_rows(b - 1, b); },
        "physical_rows: [" + to_string(b - 1) + ", " + to_string(b) + ")" + lim);
    expect_refused_unchanged(
        *l, [&] { (void)l->physical_rows(b + 2, b + 1); },
        "physical_rows: [" + to_string(b + 2) + ", " + to_string(b + 1) + ")" + lim);
  }
}

TEST(Refusals, DecodeQueries) {
  Layers ls;
  for (KvLayer* l : ls.all()) {
    const Geometry& g = l->geometry();
    const std::vector<float> q(std::size_t(6 * g.head_dim_k), 0.5f);
    const std::span<const float> qs(q);
    for (const char* op : {"decode", "decode_dc", "decode_dcw"}) {
      const std::string o = op;
      auto run = [l, o](std::span<const float> q, int heads) {
        return [=] {
          if (o == "decode")
            (void)l->decode(q, heads);
          else if (o == "decode_dc")
            (void)l->decode_dc(q, heads);
          else
            (void)l->decode_dcw(q, heads);
        };
      };
      // n_kv_heads is 2 everywhere: 3 is not a multiple, 0 is not positive.
      expect_refused_unchanged(*l, run(qs.first(std::size_t(3 * g.head_dim_k)), 3),
                               o + ": n_q_heads 3 must be a positive multiple of n_kv_heads 2");
      expect_refused_unchanged(*l, run(qs.first(0), 0),
                               o + ": n_q_heads 0 must be a positive multiple of n_kv_heads 2");
      expect_refused_unchanged(
          *l, run(qs.first(std::size_t(4 * g.head_dim_k - 1)), 4),
          o + ": q has 127 values, expected n_q_heads 4 x head_dim_k 32 = 128");
      expect_refused_unchanged(
          *l, run(qs, 4), o + ": q has 192 values, expected n_q_heads 4 x head_dim_k 32 = 128");
    }
  }
}

TEST(Refusals, DecodeVariantsOnTheWrongLayer) {
  Layers ls;
  const std::vector<float> q(std::size_t(2 * 32), 0.25f);
  expect_refused_unchanged(
      ls.ring, [&] { (void)ls.ring.decode_dc(q, 2); }, "decode_dc: ring layers use decode_dcw");
  expect_refused_unchanged(
      ls.windowed, [&] { (void)ls.windowed.decode_dc(q, 2); },
      "decode_dc: attends [0, len_d) and ignores the window 3; windowed layers use decode_dcw");
  for (KvLayer* l : {&ls.flat, &ls.dirty})
    expect_refused_unchanged(
        *l, [&] { (void)l->decode_dcw(q, 2); },
        "decode_dcw: the layer has no window; use decode_dc");
}

TEST(Refusals, HostDecodeRightAfterARewindToTheLimit) {
  // README "Where SPEC.md is silent": can_rewind_to(p) only guarantees p − (window − 1) ≥ base,
  // so the host-len view [p − window, p) starts one row below base until the next append.
  Layers ls;
  ls.ring.rewind(92);  // the limit for base 32, window 61
  const std::vector<float> q(std::size_t(2 * 32), 0.25f);
  expect_refused_unchanged(
      ls.ring, [&] { (void)ls.ring.decode(q, 2); },
      "decode: the view starts at logical row 31, below base 32 (not resident; append before "
      "decoding after a rewind this deep)");
  ls.ring.append(random_rows(ls.ring_g, 1, ls.rng).f32_view());
  EXPECT_NO_THROW((void)ls.ring.decode(q, 2));
}

}  // namespace
}  // namespace kvlayer::testing
