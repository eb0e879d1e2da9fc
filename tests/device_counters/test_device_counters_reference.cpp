// The device-counter model (SPEC §7, §9) and data errors (SPEC §3): append_dc/append_dcw,
// inc_seqlen, account_steps, decode_dc/decode_dcw; headroom overruns record a DeviceError with
// the right kind/len_d/base_d/limit and write nothing; bad blocks record the lowest
// (row, plane, block) with the exact describe() message.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testbed.hpp"

namespace kvlayer::testing {
namespace {

/// One row of random data for the device-counter appends.
HostRows one_row(const Geometry& g, Rng& rng) {
  return random_rows(g, 1, rng);
}

TEST(DeviceCounters, AppendDcWritesAtLenDAndLeavesLenDAlone) {
  const Geometry g = flat_geometry(2, 32, 64, 9);
  KvLayer l(g);
  Shadow m(g);
  Rng rng(1);
  const HostRows host = random_rows(g, 3, rng);
  l.append(host.f32_view());
  m.append(host);
  const HostRows r = one_row(g, rng);
  l.append_dc(r.f32_view());
  m.append_device(r, false);
  EXPECT_EQ(l.len_d(), 3);  // the append does not move len_d ...
  EXPECT_EQ(l.len(), 3);
  EXPECT_EQ(state_diff(m, l), "");
  l.inc_seqlen();  // ... inc_seqlen does, and only len_d
  m.inc_seqlen();
  EXPECT_EQ(l.len_d(), 4);
  EXPECT_EQ(l.len(), 3);
  l.account_steps(1);
  m.account_steps(1);
  EXPECT_EQ(l.len(), 4);
  EXPECT_EQ(state_diff(m, l), "");
  EXPECT_TRUE(l.status().ok());
}

TEST(DeviceCounters, AccountStepsDoesNotReadLenD) {
  // README "Where SPEC.md is silent": account_steps(k) does not check len + k == len_d; the host
  // owns that. After a wrong count the layer holds len != len_d until the next host append or
  // rewind sets len_d = len again.
  const Geometry g = flat_geometry(1, 32, 32, 8);
  KvLayer l(g);
  l.inc_seqlen();
  l.inc_seqlen();
  l.account_steps(1);
  EXPECT_EQ(l.len(), 1);
  EXPECT_EQ(l.len_d(), 2);
  l.rewind(1);
  EXPECT_EQ(l.len_d(), 1);
}

TEST(DeviceCounters, AppendDcPastMaxCtxWritesNothingAndRecordsTheError) {
  const Geometry g = flat_geometry(1, 32, 64, 5);
  KvLayer l(g);
  Rng rng(2);
  l.append(random_rows(g, 5, rng).f32_view());
  const Snapshot before = snapshot(l);
  l.append_dc(one_row(g, rng).f32_view());
  EXPECT_EQ(l.k_plane(), before.k_plane);
  EXPECT_EQ(l.v_plane(), before.v_plane);
  EXPECT_EQ(l.len_d(), 5);
  ASSERT_TRUE(l.status().device_error);
  EXPECT_EQ(*l.status().device_error, (DeviceError{DeviceErrorKind::append_past_max_ctx, 5, 0, 5}));
  EXPECT_FALSE(l.status().data_error);
  EXPECT_EQ(l.status().message(),
            "device error: device-counter append at len_d 5: reaches max_ctx 5; nothing was "
            "written");
}

TEST(DeviceCounters, DeviceLenAloneCanReachMaxCtx) {
  // A replayed chain longer than its headroom: len_d moves on the device while len stays.
  const Geometry g = flat_geometry(1, 32, 32, 4, 3);
  KvLayer l(g);
  Rng rng(3);
  for (int i = 0; i < 4; ++i) l.inc_seqlen();
  l.append_dcw(one_row(g, rng).f32_view());  // flat: base_d 0, so rows == max_ctx
  EXPECT_EQ(*l.status().device_error, (DeviceError{DeviceErrorKind::append_past_max_ctx, 4, 0, 4}));
  EXPECT_EQ(snapshot(KvLayer(g)).k_plane, l.k_plane());  // nothing written anywhere
}

TEST(DeviceCounters, AppendDcwOutsideTheRingRows) {
  const Geometry g = ring_geometry(1, 32, 32, 1000, 61, 5, 3);  // rows 100
  KvLayer l(g);
  Rng rng(4);
  l.append(random_rows(g, 100, rng).f32_view());
  const Snapshot before = snapshot(l);
  l.append_dcw(one_row(g, rng).f32_view());
  EXPECT_EQ(l.k_plane(), before.k_plane);
  EXPECT_EQ(l.v_plane(), before.v_plane);
  const DeviceError want{DeviceErrorKind::append_outside_rows, 100, 0, 100};
  EXPECT_EQ(l.status().device_error, want);
  EXPECT_EQ(kvlayer::describe(want),
            "device error: device-counter append at len_d 100, base_d 0: physical row 100 is "
            "outside the plane's 100 rows (call reserve(k) before a chain of k steps); nothing "
            "was written");
  // The first device error sticks: a second, different one is not recorded over it.
  l.inc_seqlen();
  Rng qr(5);
  EXPECT_FALSE(l.decode_dcw(random_query(g, 1, qr), 1));
  EXPECT_EQ(l.status().device_error, want);
  l.clear_status();
  EXPECT_TRUE(l.status().ok());
  EXPECT_FALSE(l.decode_dcw(random_query(g, 1, qr), 1));
  EXPECT_EQ(l.status().device_error,
            (DeviceError{DeviceErrorKind::decode_view_too_long, 101, 0, 100}));
}

TEST(DeviceCounters, TheFirstAppendErrorSticksOverLaterOnes) {
  // Two failing appends of different kinds: the status keeps the first until clear_status().
  const Geometry g = ring_geometry(1, 32, 32, 110, 61, 5, 3);  // rows 100
  KvLayer l(g);
  Rng rng(13);
  l.append(random_rows(g, 100, rng).f32_view());
  l.append_dcw(one_row(g, rng).f32_view());  // physical row 100: outside the rows
  const DeviceError first{DeviceErrorKind::append_outside_rows, 100, 0, 100};
  EXPECT_EQ(l.status().device_error, first);
  for (int i = 0; i < 10; ++i) l.inc_seqlen();
  l.append_dcw(one_row(g, rng).f32_view());  // len_d 110 == max_ctx
  EXPECT_EQ(l.status().device_error, first);
  l.clear_status();
  l.append_dcw(one_row(g, rng).f32_view());
  EXPECT_EQ(l.status().device_error,
            (DeviceError{DeviceErrorKind::append_past_max_ctx, 110, 0, 110}));
}

TEST(DeviceCounters, BothLimitsExceededReportsMaxCtx) {
  // rows == max_ctx == 20: at len_d 20 both "len_d − base_d ≥ rows" and "len_d ≥ max_ctx"
  // hold. SPEC §7 lists both conditions without an order; the reference reports max_ctx.
  const Geometry g = ring_geometry(1, 32, 32, 20, 10, 2, 0);
  KvLayer l(g);
  Rng rng(6);
  for (int i = 0; i < 20; ++i) l.inc_seqlen();
  l.append_dcw(one_row(g, rng).f32_view());
  EXPECT_EQ(l.status().device_error,
            (DeviceError{DeviceErrorKind::append_past_max_ctx, 20, 0, 20}));
}

TEST(DeviceCounters, AppendDcwPastMaxCtxOnARingWithABase) {
  const Geometry g = ring_geometry(1, 32, 32, 120, 61, 5, 3);  // rows 100
  KvLayer l(g);
  Shadow m(g);
  Rng rng(7);
  for (int i = 0; i < 120; ++i) {
    const HostRows r = one_row(g, rng);
    l.append(r.f32_view());
    m.append(r);
  }
  ASSERT_EQ(l.base(), 32);
  const HostRows r = one_row(g, rng);
  l.append_dcw(r.f32_view());
  m.append_device(r, true);
  EXPECT_EQ(l.status().device_error,
            (DeviceError{DeviceErrorKind::append_past_max_ctx, 120, 32, 120}));
  EXPECT_EQ(state_diff(m, l), "");
}

TEST(DeviceCounters, DecodeDcViewLongerThanMaxCtx) {
  const Geometry g = flat_geometry(2, 32, 32, 8);
  KvLayer l(g);
  Rng rng(8);
  l.append(random_rows(g, 8, rng).f32_view());
  const auto q = random_query(g, 4, rng);
  const auto at_limit = l.decode_dc(q, 4);  // len_d == max_ctx: fine
  ASSERT_TRUE(at_limit);
  EXPECT_EQ(compare_outputs(l.decode(q, 4), *at_limit), "");
  l.inc_seqlen();
  const Snapshot before = snapshot(l);
  EXPECT_FALSE(l.decode_dc(q, 4));
  const DeviceError want{DeviceErrorKind::decode_view_too_long, 9, 0, 8};
  EXPECT_EQ(l.status().device_error, want);
  EXPECT_EQ(l.status().message(),
            "device error: device-counter decode at len_d 9, base_d 0: the view exceeds its "
            "limit of 8 keys or resident rows; nothing was written");
  EXPECT_EQ(l.k_plane(), before.k_plane);
}

TEST(DeviceCounters, DecodeDcwBelowTheBaseAfterARewindToTheLimit) {
  const Geometry g = ring_geometry(1, 32, 32, 1000, 61, 5, 3);
  KvLayer l(g);
  Rng rng(9);
  for (int i = 0; i < 101; ++i) l.append(one_row(g, rng).f32_view());
  ASSERT_EQ(l.base(), 32);
  l.rewind(92);  // legal; the view [31, 92) starts one row below base until the next append
  const auto q = random_query(g, 1, rng);
  EXPECT_FALSE(l.decode_dcw(q, 1));
  EXPECT_EQ(l.status().device_error,
            (DeviceError{DeviceErrorKind::decode_view_too_long, 92, 32, 100}));
  l.clear_status();
  // The device-counter step: append at the slot, inc, decode: resident again.
  l.append_dcw(one_row(g, rng).f32_view());
  l.inc_seqlen();
  const auto out = l.decode_dcw(q, 1);
  ASSERT_TRUE(out);
  EXPECT_TRUE(l.status().ok()) << l.status().message();
  l.account_steps(1);
  EXPECT_EQ(compare_outputs(l.decode(q, 1), *out), "");
}

TEST(DeviceCounters, DeviceStepChainsMatchTheOracleAtEveryStep) {
  // Flat window-less with decode_dc and a ring with decode_dcw after reserve(k): every step's
  // decode equals the float64 oracle over the model's rows [view of len_d].
  for (const Geometry& g :
       {flat_geometry(2, 32, 64, 70), ring_geometry(2, 64, 32, 400, 63, 4, 2)}) {
    const bool ring = g.is_ring();
    KvLayer l(g);
    Shadow m(g);
    Rng rng(10);
    int steps = 0;
    while (l.len() + 4 <= std::min<std::int64_t>(g.max_ctx, 260)) {
      if (ring) {
        l.reserve(4);
        m.reserve(4);
      }
      for (int s = 0; s < 4; ++s, ++steps) {
        const HostRows r = one_row(g, rng);
        if (ring) {
          l.append_dcw(r.f32_view());
        } else {
          l.append_dc(r.f32_view());
        }
        m.append_device(r, ring);
        l.inc_seqlen();
        m.inc_seqlen();
        const auto q = random_query(g, 6, rng);
        const auto got = ring ? l.decode_dcw(q, 6) : l.decode_dc(q, 6);
        const auto view = m.device_view(ring);
        ASSERT_TRUE(got && view) << l.status().message();
        const auto want =
            oracle_decode(g, q, 6, default_scale(g), view->first, view->second,
                          [&](Plane p, std::int64_t t) { return m.dequantized(p, t, true); });
        ASSERT_EQ(compare_outputs(want, *got), "") << g.describe() << " step " << steps;
      }
      l.account_steps(4);
      m.account_steps(4);
      ASSERT_EQ(state_diff(m, l), "");
    }
    EXPECT_GT(steps, 60);
    if (ring) {
      EXPECT_GT(l.base(), 0) << "the chain never rebased";
    }
  }
}

// ---- data errors -------------------------------------------------------------------------------

TEST(DataErrors, TheLowestRowPlaneBlockIsKeptWithItsExactMessage) {
  const Geometry g = flat_geometry(2, 64, 32, 16);  // K: 4 blocks per row, V: 2
  KvLayer l(g);
  Shadow m(g);
  Rng rng(11);
  HostRows good = random_rows(g, 5, rng);
  l.append(good.f32_view());
  m.append(good);
  HostRows bad = random_rows(g, 3, rng);                     // logical rows 5, 6, 7
  bad.k[std::size_t(2 * g.kv_dim_k() + 40)] = NAN;           // row 7, K block 1
  bad.v[std::size_t(1 * g.kv_dim_v() + 33)] = INFINITY;      // row 6, V block 1
  bad.k[std::size_t(1 * g.kv_dim_k() + 3 * 32 + 4)] = 1e9f;  // row 6, K block 3: d overflows
  l.append(bad.f32_view());
  m.append(bad);
  EXPECT_EQ(state_diff(m, l), "");  // canonical bad blocks where the model put them
  ASSERT_TRUE(l.status().data_error);
  const kvlayer::DataError e = *l.status().data_error;
  EXPECT_EQ(e.row, 6);
  EXPECT_EQ(e.plane, Plane::k);  // K before V in the same row
  EXPECT_EQ(e.block, 3);
  EXPECT_EQ(e.value, 1e9f);
  EXPECT_EQ(l.status().message(),
            "data error: row 6, plane K, block 3: value 1e+09 cannot be represented (non-finite, "
            "or its fp16 scale or minimum overflows); the block was written as the canonical bad "
            "block");
  // The canonical bad K block of row 6, block 3: d = 0x7E00, quants 0.
  const auto* blk = l.k_plane().data() + 6 * g.k_tok_bytes() + 3 * 34;
  EXPECT_EQ(blk[0], 0x00);
  EXPECT_EQ(blk[1], 0x7E);
  for (int j = 2; j < 34; ++j) EXPECT_EQ(blk[j], 0) << j;
  // Appends after it proceed; a later bad row does not replace the record.
  HostRows later = random_rows(g, 1, rng);
  later.v[0] = -NAN;
  l.append(later.f32_view());
  m.append(later);
  EXPECT_EQ(l.status().data_error->row, 6);
  EXPECT_EQ(l.len(), 9);
  EXPECT_EQ(state_diff(m, l), "");
  // Rewinding past the bad rows and writing a bad block at a lower row: the lowest key wins.
  l.rewind(2);
  m.rewind(2);
  HostRows low = random_rows(g, 1, rng);
  low.v[5] = NAN;  // row 2, V block 0
  l.append(low.f32_view());
  m.append(low);
  EXPECT_EQ(state_diff(m, l), "");
  const kvlayer::DataError e2 = *l.status().data_error;
  EXPECT_EQ(e2.row, 2);
  EXPECT_EQ(e2.plane, Plane::v);
  EXPECT_EQ(e2.block, 0);
  EXPECT_TRUE(std::isnan(e2.value));
  EXPECT_EQ(kvlayer::describe(e2),
            "data error: row 2, plane V, block 0: value nan cannot be represented (non-finite, or "
            "its fp16 scale or minimum overflows); the block was written as the canonical bad "
            "block");
  // Decode over a bad block is loud: NaN, never plausible.
  const auto out = l.decode(random_query(g, 2, rng), 2);
  EXPECT_TRUE(std::isnan(out[0]));
  // A NaN report compares equal to itself (status snapshots must be reflexive).
  const kvlayer::LayerStatus copy = l.status();
  EXPECT_TRUE(copy == l.status());
  l.clear_status();
  EXPECT_TRUE(l.status().ok());
  EXPECT_FALSE(copy == l.status());
}

TEST(DataErrors, DeviceCounterAppendsReportTheDeviceRow) {
  const Geometry g = ring_geometry(1, 32, 32, 1000, 61, 5, 3);
  KvLayer l(g);
  Shadow m(g);
  Rng rng(12);
  const HostRows first = random_rows(g, 100, rng);
  l.append(first.f32_view());
  m.append(first);
  l.reserve(2);
  m.reserve(2);
  HostRows r = one_row(g, rng);
  r.k[17] = -INFINITY;
  l.append_dcw(r.f32_view());
  m.append_device(r, true);
  EXPECT_EQ(state_diff(m, l), "");
  ASSERT_TRUE(l.status().data_error);
  EXPECT_EQ(l.status().data_error->row, 100);  // logical len_d, not the physical row 68
  EXPECT_EQ(l.status().data_error->block, 0);
  EXPECT_EQ(l.status().data_error->value, -INFINITY);
  // Data and device errors are reported together, data first.
  for (int i = 0; i < 40; ++i) l.inc_seqlen();
  l.append_dcw(one_row(g, rng).f32_view());
  EXPECT_EQ(l.status().message(),
            "data error: row 100, plane K, block 0: value -inf cannot be represented (non-finite, "
            "or its fp16 scale or minimum overflows); the block was written as the canonical bad "
            "block\ndevice error: device-counter append at len_d 140, base_d 32: physical row 108 "
            "is outside the plane's 100 rows (call reserve(k) before a chain of k steps); nothing "
            "was written");
}

}  // namespace
}  // namespace kvlayer::testing
