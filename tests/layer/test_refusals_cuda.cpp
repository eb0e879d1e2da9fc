// Refusals and device-detected errors (SPEC §7, §9): every refused request carries the
// reference's exact message and leaves planes, counters and status untouched; unsupported
// geometries are refused at construction naming the value and the supported set; device-counter
// steps beyond their headroom write nothing and record the reference's DeviceError.
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_testbed.hpp"
#include "kvlayer/cuda/limits.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

std::string construction_refusal(const Geometry& g, int n_q_heads) {
  return refusal_of([&] { cuda::KvLayer layer(g, n_q_heads, nullptr); });
}

TEST(CudaRefusals, UnsupportedGeometriesNameTheValueAndTheSupportedSet) {
  KVLAYER_REQUIRE_GPU();
  {
    Geometry g = flat(2, 128, 64);
    g.head_dim_v = 64;
    const std::string m = construction_refusal(g, 2);
    EXPECT_NE(m.find("head_dim_k 128 != head_dim_v 64"), std::string::npos) << m;
    EXPECT_NE(m.find("supported: " + cuda::supported_head_dims()), std::string::npos) << m;
  }
  for (int hd : {32, 96, 160, 512}) {
    if (cuda::head_dim_supported(hd)) continue;
    const std::string m = construction_refusal(flat(1, hd, 64), 1);
    EXPECT_NE(m.find("head_dim " + std::to_string(hd)), std::string::npos) << m;
    EXPECT_NE(m.find("supported: " + cuda::supported_head_dims()), std::string::npos) << m;
  }
  {
    const std::string m = construction_refusal(flat(4, 64, 64), 6);
    EXPECT_NE(m.find("n_q_heads 6 must be a positive multiple of n_kv_heads 4"), std::string::npos)
        << m;
    EXPECT_NE(construction_refusal(flat(4, 64, 64), 0), "");
  }
  {
    const std::string m = construction_refusal(flat(2, 64, 64), 34);
    EXPECT_NE(m.find("gqa 17"), std::string::npos) << m;
    EXPECT_NE(m.find("supported: 1..16"), std::string::npos) << m;
  }
  // Illegal geometries: the reference's own messages.
  std::vector<Geometry> illegal;
  illegal.push_back(flat(1, 64, 0));
  illegal.push_back(flat(0, 64, 10));
  illegal.push_back(flat(1, 64, std::int64_t(1) << 31));
  illegal.push_back(flat(1, 64, 10, 0));
  {
    Geometry g = ring(1, 64, 100, 10, 1, 0);
    g.window.reset();
    illegal.push_back(g);
  }
  illegal.push_back(ring(1, 64, 100, 10, 0, 0));
  illegal.push_back(ring(1, 64, 100, 10, 1, -1));
  for (const Geometry& g : illegal) {
    const std::string ref_msg = refusal_of([&] { ref::KvLayer r(g); });
    ASSERT_NE(ref_msg, "") << g.describe();
    EXPECT_EQ(construction_refusal(g, std::max(g.n_kv_heads, 1)), ref_msg);
  }
  // Every supported combination constructs.
  for (int hd : cuda::kSupportedHeadDims)
    for (int gqa = 1; gqa <= 16; ++gqa)
      EXPECT_EQ(construction_refusal(flat(2, hd, 8), 2 * gqa), "") << hd << " gqa " << gqa;
}

/// Checks one refused request on both layers: same message, GPU state unchanged and equal.
void expect_refused(cuda::KvLayer& gpu, ref::KvLayer& ref, const std::function<void()>& on_gpu,
                    const std::function<void()>& on_ref, const std::string& what) {
  SCOPED_TRACE(what);
  const Snapshot before = snapshot(gpu);
  const std::string want = refusal_of(on_ref);
  const std::string got = refusal_of(on_gpu);
  EXPECT_NE(want, "") << "the reference accepted it";
  EXPECT_EQ(got, want);
  EXPECT_TRUE(same_state(snapshot(gpu), before, gpu.geometry())) << "state changed";
  EXPECT_TRUE(same_state(gpu, ref));
}

TEST(CudaRefusals, RefusedRequestsLeaveTheStateUntouched) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x4EF);
  const Geometry rg = ring(2, 64, 300, 40, 6, 3);  // rows = 40 + 6 + 3 + 31 = 80
  const Geometry fg = flat(2, 64, 50);
  const Geometry wg = flat(2, 64, 50, 9);
  for (const Geometry& g : {rg, fg, wg}) {
    SCOPED_TRACE(g.describe());
    cuda::KvLayer gpu(g, 4, stream.get());
    ref::KvLayer ref(g);
    // Some history first: on the ring, enough to have rebased.
    const std::int64_t target = g.is_ring() ? 130 : 44;
    while (ref.len() < target) {
      const std::int64_t n = std::min<std::int64_t>(g.is_ring() ? 5 : 11, target - ref.len());
      const HostRows rows = make_rows(g, n, DType::f16, Fill::adversarial, rng);
      const DeviceRows d(rows);
      gpu.append(d.view);
      ref.append(rows.view());
    }
    ASSERT_TRUE(same_state(gpu, ref));
    if (g.is_ring()) {
      ASSERT_GT(ref.base(), 0);
    }

    const HostRows rows = make_rows(g, 8, DType::f32, Fill::random, rng);
    const DeviceRows d(rows);
    auto with_n = [&](std::int64_t n) {
      cuda::RowsView v = d.view;
      v.n = n;
      return v;
    };
    auto ref_n = [&](std::int64_t n) {
      ref::RowsView v = rows.view();
      v.n = n;
      return v;
    };
    const std::int64_t len = ref.len();

    // append
    expect_refused(
        gpu, ref,
        [&] {
          gpu.append({nullptr, d.view.v, 1, DType::f32});
        },
        [&] {
          ref.append({nullptr, rows.v_bytes.data(), 1, DType::f32});
        },
        "append null k");
    expect_refused(
        gpu, ref,
        [&] {
          gpu.append({d.view.k, nullptr, 1, DType::f32});
        },
        [&] {
          ref.append({rows.k_bytes.data(), nullptr, 1, DType::f32});
        },
        "append null v");
    expect_refused(
        gpu, ref, [&] { gpu.append(with_n(0)); }, [&] { ref.append(ref_n(0)); }, "append n 0");
    expect_refused(
        gpu, ref, [&] { gpu.append(with_n(-3)); }, [&] { ref.append(ref_n(-3)); }, "append n -3");
    if (!g.is_ring()) {
      expect_refused(
          gpu, ref, [&] { gpu.append(with_n(g.max_ctx - len + 1)); },
          [&] { ref.append(ref_n(g.max_ctx - len + 1)); }, "append past max_ctx");
    } else {
      // 8 rows cannot fit: keep = len − align_down(len − 39 − 3) ≥ 42, and 42 + 8 > ... rows 80
      // only when keep > 72; use a chunk that surely exceeds the plane instead.
      const HostRows big = make_rows(g, 60, DType::f32, Fill::random, rng);
      const DeviceRows dbig(big);
      expect_refused(
          gpu, ref, [&] { gpu.append(dbig.view); }, [&] { ref.append(big.view()); },
          "ring append that does not fit");
    }
    // reserve
    expect_refused(
        gpu, ref, [&] { gpu.reserve(-1); }, [&] { ref.reserve(-1); }, "reserve -1");
    expect_refused(
        gpu, ref, [&] { gpu.reserve(g.max_ctx - len + 1); },
        [&] { ref.reserve(g.max_ctx - len + 1); }, "reserve past max_ctx");
    if (g.is_ring())
      expect_refused(
          gpu, ref, [&] { gpu.reserve(g.rows()); }, [&] { ref.reserve(g.rows()); },
          "reserve more than the ring holds");
    // rewind
    expect_refused(
        gpu, ref, [&] { gpu.rewind(len + 1); }, [&] { ref.rewind(len + 1); }, "rewind forward");
    expect_refused(
        gpu, ref, [&] { gpu.rewind(-1); }, [&] { ref.rewind(-1); }, "rewind -1");
    if (g.is_ring())
      expect_refused(
          gpu, ref, [&] { gpu.rewind(ref.base()); }, [&] { ref.rewind(ref.base()); },
          "rewind below the ring's resident rows");
    // physical_rows
    expect_refused(
        gpu, ref, [&] { (void)gpu.physical_rows(len, len - 1); },
        [&] { (void)ref.physical_rows(len, len - 1); }, "physical_rows end < start");
    expect_refused(
        gpu, ref, [&] { (void)gpu.physical_rows(0, g.rows() + ref.base() + 1); },
        [&] { (void)ref.physical_rows(0, g.rows() + ref.base() + 1); },
        "physical_rows beyond the plane");
    if (g.is_ring())
      expect_refused(
          gpu, ref, [&] { (void)gpu.physical_rows(ref.base() - 1, len); },
          [&] { (void)ref.physical_rows(ref.base() - 1, len); }, "physical_rows below base");
    // device-counter family
    expect_refused(
        gpu, ref, [&] { gpu.append_dc(with_n(2)); }, [&] { ref.append_dc(ref_n(2)); },
        "append_dc n 2");
    expect_refused(
        gpu, ref, [&] { gpu.append_dcw(with_n(2)); }, [&] { ref.append_dcw(ref_n(2)); },
        "append_dcw n 2");
    expect_refused(
        gpu, ref,
        [&] {
          gpu.append_dcw({nullptr, nullptr, 1, DType::f32});
        },
        [&] {
          ref.append_dcw({nullptr, nullptr, 1, DType::f32});
        },
        "append_dcw null");
    if (g.is_ring())
      expect_refused(
          gpu, ref, [&] { gpu.append_dc(with_n(1)); }, [&] { ref.append_dc(ref_n(1)); },
          "append_dc on a ring");
    expect_refused(
        gpu, ref, [&] { gpu.account_steps(-1); }, [&] { ref.account_steps(-1); },
        "account_steps -1");
    expect_refused(
        gpu, ref, [&] { gpu.account_steps(g.max_ctx - len + 1); },
        [&] { ref.account_steps(g.max_ctx - len + 1); }, "account_steps past max_ctx");
    if (g.is_ring()) {
      const std::int64_t beyond = g.rows() - (len - ref.base()) + 1;  // more than any reserve()
      expect_refused(
          gpu, ref, [&] { gpu.account_steps(beyond); }, [&] { ref.account_steps(beyond); },
          "account_steps beyond the plane");
    }
    // decode: the host checks come before any launch
    DeviceFloats q(std::size_t(4 * g.head_dim_k)), out(std::size_t(4 * g.head_dim_v));
    const std::vector<float> hq(q.count, 0.25f);
    if (g.is_ring() || g.window) {
      expect_refused(
          gpu, ref, [&] { gpu.decode_dc(q.get(), out.get()); }, [&] { (void)ref.decode_dc(hq, 4); },
          "decode_dc on a windowed layer");
    } else {
      expect_refused(
          gpu, ref, [&] { gpu.decode_dcw(q.get(), out.get()); },
          [&] { (void)ref.decode_dcw(hq, 4); }, "decode_dcw without a window");
    }
    for (auto* f : {+[](cuda::KvLayer&l, float*o) { l.decode(nullptr, o); },
                    +[](cuda::KvLayer&l, float*o) { l.decode_dc(nullptr, o); },
                    +[](cuda::KvLayer&l, float*o) { l.decode_dcw(nullptr, o); }}) {
      const Snapshot before = snapshot(gpu);
      const std::string m = refusal_of([&] { f(gpu, out.get()); });
      EXPECT_NE(m, "");
      EXPECT_TRUE(same_state(snapshot(gpu), before, g));
    }
    // GPU-only: misaligned element pointers (a device fault otherwise).
    {
      cuda::RowsView v = with_n(1);
      v.k = static_cast<const std::uint8_t*>(v.k) + 2;
      const Snapshot before = snapshot(gpu);
      const std::string m = refusal_of([&] { gpu.append(v); });
      EXPECT_NE(m.find("aligned"), std::string::npos) << m;
      EXPECT_TRUE(same_state(snapshot(gpu), before, g));
    }
    EXPECT_TRUE(same_state(gpu, ref));
  }
}

/// Host-len decode after a rewind this deep is refused on both (SPEC §6: the view may start
/// below base until the next append).
TEST(CudaRefusals, DecodeBelowBaseAfterDeepRewind) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xDEE9);
  const Geometry g = ring(1, 64, 400, 33, 4, 0);  // rows = 33 + 4 + 0 + 31 = 68
  cuda::KvLayer gpu(g, 1, stream.get());
  ref::KvLayer ref(g);
  while (ref.base() == 0 || ref.len() % 32 != 0) {
    const HostRows rows = make_rows(g, 1, DType::f32, Fill::random, rng);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
  }
  // The lowest legal rewind: p − 32 aligned down equals base, so the view starts at base − 1.
  std::int64_t p = ref.len();
  while (ref.can_rewind_to(p - 1)) --p;
  gpu.rewind(p);
  ref.rewind(p);
  ASSERT_LT(ref.view().first, ref.base());
  DeviceFloats q(64), out(64);
  const std::vector<float> hq(64, 0.5f);
  expect_refused(
      gpu, ref, [&] { gpu.decode(q.get(), out.get()); }, [&] { (void)ref.decode(hq, 1); },
      "decode below base");
}

/// SPEC §7: a device-counter append beyond max_ctx or outside the plane writes nothing and
/// records the reference's DeviceError; the first one sticks until clear_status().
TEST(CudaRefusals, DeviceCounterAppendOverrunsWriteNothing) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x0E7);
  {  // flat: append_dc and append_dcw at len_d = max_ctx
    const Geometry g = flat(1, 128, 5);
    cuda::KvLayer gpu(g, 1, stream.get());
    ref::KvLayer ref(g);
    const HostRows rows = make_rows(g, 5, DType::bf16, Fill::random, rng);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
    const HostRows one = make_rows(g, 1, DType::bf16, Fill::random, rng);
    const DeviceRows d1(one);
    const Snapshot before = snapshot(gpu);
    gpu.append_dc(d1.view);
    ref.append_dc(one.view());
    ASSERT_TRUE(same_state(gpu, ref));
    const Snapshot after = snapshot(gpu);
    EXPECT_EQ(after.k_plane, before.k_plane);
    EXPECT_EQ(after.v_plane, before.v_plane);
    ASSERT_TRUE(after.status.device_error.has_value());
    EXPECT_EQ(*after.status.device_error,
              (DeviceError{DeviceErrorKind::append_past_max_ctx, 5, 0, 5}));
    // Sticky: a second overrun (at len_d 6) does not replace the first.
    gpu.inc_seqlen();
    ref.inc_seqlen();
    gpu.append_dcw(d1.view);
    ref.append_dcw(one.view());
    ASSERT_TRUE(same_state(gpu, ref));
    EXPECT_EQ(gpu.status().device_error->len_d, 5);
    gpu.clear_status();
    ref.clear_status();
    gpu.append_dcw(d1.view);
    ref.append_dcw(one.view());
    ASSERT_TRUE(same_state(gpu, ref));
    EXPECT_EQ(*gpu.status().device_error,
              (DeviceError{DeviceErrorKind::append_past_max_ctx, 6, 0, 5}));
  }
  {  // ring: steps without reserve() run off the plane
    const Geometry g = ring(2, 64, 1000, 20, 3, 0);  // rows = 20 + 3 + 0 + 31 = 54
    cuda::KvLayer gpu(g, 2, stream.get());
    ref::KvLayer ref(g);
    const HostRows rows = make_rows(g, 100, DType::f32, Fill::random, rng);
    const DeviceRows d(rows);
    cuda::RowsView first = d.view;
    first.n = 3;
    ref::RowsView hfirst = rows.view();
    hfirst.n = 3;
    for (int i = 0; i < 30; ++i) {  // rebase a few times
      gpu.append(first);
      ref.append(hfirst);
    }
    ASSERT_GT(ref.base(), 0);
    const std::int64_t room = g.rows() - (ref.len() - ref.base());
    const HostRows one = make_rows(g, 1, DType::f32, Fill::random, rng);
    const DeviceRows d1(one);
    for (std::int64_t i = 0; i <= room; ++i) {
      const Snapshot before = snapshot(gpu);
      gpu.append_dcw(d1.view);
      ref.append_dcw(one.view());
      gpu.inc_seqlen();
      ref.inc_seqlen();
      ASSERT_TRUE(same_state(gpu, ref)) << "step " << i;
      if (i == room) {  // the overrun: nothing written
        EXPECT_EQ(snapshot(gpu).k_plane, before.k_plane);
        EXPECT_EQ(snapshot(gpu).v_plane, before.v_plane);
      }
    }
    const auto err = gpu.status().device_error;
    ASSERT_TRUE(err.has_value());
    EXPECT_EQ(err->kind, DeviceErrorKind::append_outside_rows);
    EXPECT_EQ(err->limit, g.rows());
    EXPECT_EQ(err->len_d - err->base_d, g.rows());
    EXPECT_EQ(gpu.status().message(), ref.status().message());
  }
  {  // ring capped by max_ctx: append_dcw at len_d = max_ctx reports max_ctx first
    const Geometry g = ring(1, 64, 40, 30, 8, 0);  // rows = min(40, 69) = 40
    cuda::KvLayer gpu(g, 1, stream.get());
    ref::KvLayer ref(g);
    const HostRows rows = make_rows(g, 40, DType::f16, Fill::random, rng);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
    const HostRows one = make_rows(g, 1, DType::f16, Fill::random, rng);
    const DeviceRows d1(one);
    gpu.append_dcw(d1.view);
    ref.append_dcw(one.view());
    ASSERT_TRUE(same_state(gpu, ref));
    EXPECT_EQ(gpu.status().device_error->kind, DeviceErrorKind::append_past_max_ctx);
  }
}

/// SPEC §7: a device-counter decode whose view is longer than the grid or leaves the resident
/// rows writes nothing to out and records decode_view_too_long with the reference's limit.
TEST(CudaRefusals, DeviceCounterDecodeOverrunsWriteNothing) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xDEC0);
  auto expect_untouched = [&](const DeviceFloats& out) {
    const std::vector<float> h = out.download(stream.get());
    for (float x : h) ASSERT_EQ(std::bit_cast<std::uint32_t>(x), 0xFFFFFFFFu) << "out was written";
  };
  {  // flat: len_d = max_ctx + 1
    const Geometry g = flat(2, 64, 7);
    cuda::KvLayer gpu(g, 8, stream.get());
    ref::KvLayer ref(g);
    const HostRows rows = make_rows(g, 7, DType::f32, Fill::random, rng);
    const DeviceRows d(rows);
    gpu.append(d.view);
    ref.append(rows.view());
    gpu.inc_seqlen();
    ref.inc_seqlen();
    DeviceFloats q(8 * 64), out(8 * 64);
    std::vector<float> hq(q.count);
    for (float& x : hq) x = rng.uniform(-1, 1);
    q.upload(hq);
    out.poison(stream.get());
    gpu.decode_dc(q.get(), out.get());
    EXPECT_FALSE(ref.decode_dc(hq, 8).has_value());
    ASSERT_TRUE(same_state(gpu, ref));
    EXPECT_EQ(*gpu.status().device_error,
              (DeviceError{DeviceErrorKind::decode_view_too_long, 8, 0, 7}));
    expect_untouched(out);
  }
  {  // ring: after the deepest legal rewind the device view starts below base_d
    const Geometry g = ring(1, 128, 400, 33, 4, 0);
    cuda::KvLayer gpu(g, 4, stream.get());
    ref::KvLayer ref(g);
    while (ref.base() == 0 || ref.len() % 32 != 0) {
      const HostRows rows = make_rows(g, 1, DType::f32, Fill::random, rng);
      const DeviceRows d(rows);
      gpu.append(d.view);
      ref.append(rows.view());
    }
    std::int64_t p = ref.len();
    while (ref.can_rewind_to(p - 1)) --p;
    gpu.rewind(p);
    ref.rewind(p);
    DeviceFloats q(4 * 128), out(4 * 128);
    std::vector<float> hq(q.count, 0.125f);
    q.upload(hq);
    out.poison(stream.get());
    gpu.decode_dcw(q.get(), out.get());
    EXPECT_FALSE(ref.decode_dcw(hq, 4).has_value());
    ASSERT_TRUE(same_state(gpu, ref));
    EXPECT_EQ(gpu.status().device_error->kind, DeviceErrorKind::decode_view_too_long);
    EXPECT_EQ(gpu.status().device_error->limit, g.rows());
    expect_untouched(out);
  }
}

}  // namespace
}  // namespace kvlayer::testing
