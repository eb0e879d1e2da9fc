// The flat layer (SPEC §5): append, rewind, physical_rows, capacity, and byte-identity of every
// append variant. Each test runs the reference next to the independent model (testbed.hpp)
// and compares every byte of both planes and every counter after each operation.
#include <gtest/gtest.h>

#include <vector>

#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

/// Flat bed: a reference layer, the model, and a seeded generator.
struct FlatBed {
  Geometry g;
  KvLayer layer;
  Shadow model;
  Rng rng;
  explicit FlatBed(const Geometry& geo, std::uint64_t seed = 1)
      : g(geo), layer(geo), model(geo), rng(seed) {}

  /// Appends n fresh random rows to both and returns them.
  HostRows append(std::int64_t n, Values kind = Values::varied) {
    HostRows r = random_rows(g, n, rng, kind);
    layer.append(r.f32_view());
    model.append(r);
    return r;
  }
  std::string diff() const { return state_diff(model, layer); }
};

TEST(Flat, ConstructionZeroesPlanesAndCounters) {
  FlatBed b(flat_geometry(3, 32, 64, 61));
  EXPECT_EQ(b.layer.rows(), 61);
  EXPECT_EQ(b.layer.k_plane().size(), std::size_t(61 * 3 * 34));
  EXPECT_EQ(b.layer.v_plane().size(), std::size_t(61 * 6 * 24));
  EXPECT_EQ(b.diff(), "");
  EXPECT_TRUE(b.layer.status().ok());
  EXPECT_EQ(b.layer.status().message(), "ok");
}

TEST(Flat, AppendsInOddBatchesFillTheCapacityExactly) {
  FlatBed b(flat_geometry(3, 32, 64, 61), 2);
  std::int64_t len = 0;
  for (std::int64_t n : {1, 2, 7, 1, 13, 31, 5, 1}) {
    b.append(n);
    len += n;
    ASSERT_EQ(b.layer.len(), len);
    ASSERT_EQ(b.layer.len_d(), len);
    ASSERT_EQ(b.layer.base(), 0);
    ASSERT_EQ(b.diff(), "") << "after len " << len;
  }
  ASSERT_EQ(len, 61);  // exactly max_ctx: full
  expect_refused_unchanged(
      b.layer, [&] { b.layer.append(random_rows(b.g, 1, b.rng).f32_view()); },
      "append: len 61 + n 1 exceeds max_ctx 61");
}

TEST(Flat, PhysicalRowsIsTheIdentityUpToMaxCtx) {
  FlatBed b(flat_geometry(1, 32, 32, 63), 3);
  b.append(10);
  using P = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(b.layer.physical_rows(0, 0), P(0, 0));
  EXPECT_EQ(b.layer.physical_rows(3, 9), P(3, 9));
  EXPECT_EQ(b.layer.physical_rows(0, 63), P(0, 63));  // past len is fine: stale rows are rows
  EXPECT_EQ(b.layer.physical_rows(63, 63), P(63, 63));
  expect_refused_unchanged(
      b.layer, [&] { (void)b.layer.physical_rows(0, 64); },
      "physical_rows: [0, 64) is not within the resident rows [0, 63)");
  expect_refused_unchanged(
      b.layer, [&] { (void)b.layer.physical_rows(5, 4); },
      "physical_rows: [5, 4) is not within the resident rows [0, 63)");
  expect_refused_unchanged(
      b.layer, [&] { (void)b.layer.physical_rows(-1, 4); },
      "physical_rows: [-1, 4) is not within the resident rows [0, 63)");
}

TEST(Flat, RewindMovesOnlyTheCountersAndStaleRowsStayUntilOverwritten) {
  FlatBed b(flat_geometry(2, 64, 32, 40), 4);
  b.append(9);
  const Snapshot before = snapshot(b.layer);
  EXPECT_TRUE(b.layer.can_rewind_to(0));
  EXPECT_TRUE(b.layer.can_rewind_to(9));
  EXPECT_FALSE(b.layer.can_rewind_to(10));
  EXPECT_FALSE(b.layer.can_rewind_to(-1));
  b.layer.rewind(4);
  b.model.rewind(4);
  EXPECT_EQ(b.layer.len(), 4);
  EXPECT_EQ(b.layer.len_d(), 4);
  EXPECT_EQ(b.layer.k_plane(), before.k_plane);  // bytes untouched
  EXPECT_EQ(b.layer.v_plane(), before.v_plane);
  b.layer.rewind(4);  // to the current len: legal, a no-op
  b.model.rewind(4);
  b.append(2);  // overwrites rows 4, 5 only
  EXPECT_EQ(b.diff(), "");
  const auto tb = b.g.k_tok_bytes();
  EXPECT_NE(
      std::vector<std::uint8_t>(b.layer.k_plane().begin() + 4 * tb,
                                b.layer.k_plane().begin() + 6 * tb),
      std::vector<std::uint8_t>(before.k_plane.begin() + 4 * tb, before.k_plane.begin() + 6 * tb));
  EXPECT_EQ(
      std::vector<std::uint8_t>(b.layer.k_plane().begin() + 6 * tb,
                                b.layer.k_plane().begin() + 9 * tb),
      std::vector<std::uint8_t>(before.k_plane.begin() + 6 * tb, before.k_plane.begin() + 9 * tb));
  b.layer.rewind(0);
  b.model.rewind(0);
  EXPECT_EQ(b.diff(), "");
}

TEST(Flat, WindowedFlatLayerViewsTheLastWindowKeysAndNeverRebases) {
  FlatBed b(flat_geometry(1, 32, 32, 100, 61), 5);
  using P = std::pair<std::int64_t, std::int64_t>;
  for (std::int64_t len = 1; len <= 100; ++len) {
    b.append(1);
    ASSERT_EQ(b.layer.view(), P(std::max<std::int64_t>(0, len - 61), len));
    ASSERT_EQ(b.layer.base(), 0);
  }
  EXPECT_EQ(b.diff(), "");
  EXPECT_TRUE(b.layer.can_rewind_to(1));  // flat: any p ≤ len
  b.layer.rewind(1);
  EXPECT_EQ(b.layer.view(), P(0, 1));
}

// ---- every append variant writes the same bytes ----------------------------------------------

/// Writes `rows` into a fresh layer of geometry g with one of the append variants.
enum class Variant { batched, one_by_one, dc_steps, dcw_steps, dc_chain };

const char* name(Variant v) {
  switch (v) {
    case Variant::batched:
      return "batched";
    case Variant::one_by_one:
      return "one_by_one";
    case Variant::dc_steps:
      return "dc_steps";
    case Variant::dcw_steps:
      return "dcw_steps";
    case Variant::dc_chain:
      return "dc_chain";
  }
  return "?";
}

/// Views of row i (or all rows) of f32 or 16-bit data.
struct AnyRows {
  const HostRows* f32 = nullptr;  ///< appended as f32 values
  const HostRows* h16 = nullptr;  ///< appended as its 16-bit encoding
  kvlayer::ref::RowsView all() const { return f32 ? f32->f32_view() : h16->view(); }
  kvlayer::ref::RowsView one(const Geometry& g, std::int64_t i) const {
    const std::size_t es = f32 ? 4 : 2;
    auto v = all();
    v.k = static_cast<const char*>(v.k) + i * g.kv_dim_k() * es;
    v.v = static_cast<const char*>(v.v) + i * g.kv_dim_v() * es;
    v.n = 1;
    return v;
  }
  std::int64_t n() const { return f32 ? f32->n : h16->n; }
};

KvLayer write_with(const Geometry& g, const AnyRows& rows, Variant variant) {
  KvLayer l(g);
  switch (variant) {
    case Variant::batched:
      l.append(rows.all());
      break;
    case Variant::one_by_one:
      for (std::int64_t i = 0; i < rows.n(); ++i) l.append(rows.one(g, i));
      break;
    case Variant::dc_steps:  // one captured step per token, accounted after each
    case Variant::dcw_steps:
      for (std::int64_t i = 0; i < rows.n(); ++i) {
        if (variant == Variant::dc_steps)
          l.append_dc(rows.one(g, i));
        else
          l.append_dcw(rows.one(g, i));
        l.inc_seqlen();
        l.account_steps(1);
      }
      break;
    case Variant::dc_chain:  // the whole chain replayed, accounted once
      for (std::int64_t i = 0; i < rows.n(); ++i) {
        l.append_dc(rows.one(g, i));
        l.inc_seqlen();
      }
      l.account_steps(rows.n());
      break;
  }
  return l;
}

class AppendVariants : public ::testing::TestWithParam<DType> {};

TEST_P(AppendVariants, ProduceIdenticalBytesForTheSameValues) {
  const DType dtype = GetParam();
  for (const Geometry& g : {flat_geometry(2, 64, 32, 9), flat_geometry(1, 32, 96, 7, 3)}) {
    Rng rng(0xA11 + int(dtype));
    const HostRows rows = random_rows(g, 7, rng, Values::exact16);
    const HostRows rows16 = with_dtype(rows, dtype == DType::f32 ? DType::f16 : dtype);
    const AnyRows any = dtype == DType::f32 ? AnyRows{&rows, nullptr} : AnyRows{nullptr, &rows16};
    // The model writes the f32 values: f16/bf16 inputs are exact conversions of them.
    Shadow model(g);
    model.append(rows);
    for (Variant v : {Variant::batched, Variant::one_by_one, Variant::dc_steps, Variant::dcw_steps,
                      Variant::dc_chain}) {
      const KvLayer l = write_with(g, any, v);
      EXPECT_EQ(state_diff(model, l), "")
          << name(v) << " dtype " << kvlayer::dtype_name(dtype) << " " << g.describe();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, AppendVariants,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) {
                           return std::string(kvlayer::dtype_name(info.param));
                         });

TEST(Flat, VariantsAgreeOnRealisticF32Values) {
  // Values::varied is not exact in 16 bits, so only the f32 variants; values with per-block
  // scales from 2^-10 to 2^10.
  const Geometry g = flat_geometry(3, 32, 64, 63);
  Rng rng(0xF32);
  const HostRows rows = random_rows(g, 63, rng);
  Shadow model(g);
  model.append(rows);
  for (Variant v : {Variant::batched, Variant::one_by_one, Variant::dc_steps, Variant::dcw_steps,
                    Variant::dc_chain})
    EXPECT_EQ(state_diff(model, write_with(g, AnyRows{&rows, nullptr}, v)), "") << name(v);
}

TEST(Flat, DtypesAreConvertedExactlyBeforeQuantizing) {
  // A bf16 and an f16 input holding the same values as an f32 input write the same bytes even
  // where f16 has more precision than bf16 would keep (the values are exact in both).
  const Geometry g = flat_geometry(1, 32, 32, 4);
  Rng rng(0xD7);
  const HostRows rows = random_rows(g, 4, rng, Values::exact16);
  KvLayer a(g), b(g), c(g);
  a.append(rows.f32_view());
  const HostRows h = with_dtype(rows, DType::f16), bf = with_dtype(rows, DType::bf16);
  b.append(h.view());
  c.append(bf.view());
  EXPECT_EQ(a.k_plane(), b.k_plane());
  EXPECT_EQ(a.v_plane(), b.v_plane());
  EXPECT_EQ(a.k_plane(), c.k_plane());
  EXPECT_EQ(a.v_plane(), c.v_plane());
  // And the element converter itself.
  for (std::int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(kvlayer::ref::element_to_f32(h.k_bytes.data(), DType::f16, i),
              rows.k[std::size_t(i)]);
    EXPECT_EQ(kvlayer::ref::element_to_f32(bf.k_bytes.data(), DType::bf16, i),
              rows.k[std::size_t(i)]);
    EXPECT_EQ(kvlayer::ref::element_to_f32(rows.k.data(), DType::f32, i), rows.k[std::size_t(i)]);
  }
}

}  // namespace
}  // namespace kvlayer::testing
