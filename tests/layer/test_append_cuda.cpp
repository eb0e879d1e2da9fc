// The quantized append on the GPU against the reference, byte for byte over whole planes
// (SPEC §3, §5, §7, §10.1): every append variant (batched host-len rows, append_dc,
// append_dcw), every input dtype, random and adversarial blocks, and the data errors they raise.
#include <bit>
#include <cstdint>
#include <vector>

#include "cuda_testbed.hpp"

namespace kvlayer::testing {
namespace {

using cuda::Stream;

/// Geometries with awkward row counts; gqa 1 (decode is not exercised here).
std::vector<Geometry> append_geometries() {
  return {flat(1, 64, 67), flat(3, 128, 41), flat(2, 256, 19), flat(5, 64, 33)};
}

/// Row i of a batch as a one-row device view.
cuda::RowsView row_of(const DeviceRows& rows, const Geometry& g, std::int64_t i) {
  const std::size_t es = dtype_size(rows.view.dtype);
  return cuda::RowsView{static_cast<const std::uint8_t*>(rows.view.k) + i * g.kv_dim_k() * es,
                        static_cast<const std::uint8_t*>(rows.view.v) + i * g.kv_dim_v() * es, 1,
                        rows.view.dtype};
}

ref::RowsView host_row_of(const HostRows& rows, const Geometry& g, std::int64_t i) {
  const std::size_t es = dtype_size(rows.dtype);
  return ref::RowsView{rows.k_bytes.data() + i * g.kv_dim_k() * es,
                       rows.v_bytes.data() + i * g.kv_dim_v() * es, 1, rows.dtype};
}

std::string context(const Geometry& g, DType t, Fill f) {
  return g.describe() + " dtype " + std::string(dtype_name(t)) + " fill " + std::to_string(int(f));
}

TEST(CudaAppend, BatchedRowsEqualReferenceBytes) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xA11E7D);
  const std::int64_t batches[] = {1, 7, 13, 2, 31, 3, 64, 5};
  for (const Geometry& g : append_geometries()) {
    for (DType t : kDTypes) {
      for (Fill fill : {Fill::random, Fill::adversarial, Fill::finite_adversarial}) {
        SCOPED_TRACE(context(g, t, fill));
        cuda::KvLayer gpu(g, g.n_kv_heads, stream.get());
        ref::KvLayer ref(g);
        ASSERT_TRUE(same_state(gpu, ref));  // zeroed planes, zero counters
        for (std::size_t i = 0; ref.len() < g.max_ctx; ++i) {
          const std::int64_t n = std::min(batches[i % std::size(batches)], g.max_ctx - ref.len());
          const HostRows rows = make_rows(g, n, t, fill, rng);
          const DeviceRows drows(rows);
          gpu.append(drows.view);
          ref.append(rows.view());
          ASSERT_TRUE(same_state(gpu, ref)) << "after appending " << n << " rows";
        }
      }
    }
  }
}

/// Rows that start off 16-byte alignment (any element-aligned pointer is valid input) take the
/// append's scalar loads and give the same bytes and the same data errors.
TEST(CudaAppend, MisalignedRowsEqualReference) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x0FF5E7);
  for (const Geometry& g : append_geometries()) {
    for (DType t : kDTypes) {
      SCOPED_TRACE(context(g, t, Fill::adversarial));
      cuda::KvLayer gpu(g, g.n_kv_heads, stream.get());
      ref::KvLayer ref(g);
      const std::int64_t n = std::min<std::int64_t>(9, g.max_ctx);
      const HostRows rows = make_rows(g, n, t, Fill::adversarial, rng);
      const DeviceRows drows(rows, 1, 3);
      ASSERT_NE(reinterpret_cast<std::uintptr_t>(drows.view.k) % 16, 0u);
      gpu.append(drows.view);
      ref.append(rows.view());
      ASSERT_TRUE(same_state(gpu, ref));
    }
  }
}

/// The same rows written by append, append_dc and append_dcw give the same bytes and the same
/// status (SPEC §5 last rule), all equal to the reference's batched append.
TEST(CudaAppend, EveryVariantWritesTheSameBytes) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0x5A4E);
  for (const Geometry& g : append_geometries()) {
    for (DType t : kDTypes) {
      SCOPED_TRACE(context(g, t, Fill::adversarial));
      const HostRows rows = make_rows(g, g.max_ctx, t, Fill::adversarial, rng);
      const DeviceRows drows(rows);
      ref::KvLayer ref(g);
      ref.append(rows.view());

      cuda::KvLayer batched(g, g.n_kv_heads, stream.get());
      batched.append(drows.view);
      EXPECT_TRUE(same_state(batched, ref)) << "append";

      for (const bool windowed : {false, true}) {
        cuda::KvLayer gpu(g, g.n_kv_heads, stream.get());
        ref::KvLayer model(g);  // the device-counter model of the same steps
        for (std::int64_t i = 0; i < g.max_ctx; ++i) {
          if (windowed) {
            gpu.append_dcw(row_of(drows, g, i));
            model.append_dcw(host_row_of(rows, g, i));
          } else {
            gpu.append_dc(row_of(drows, g, i));
            model.append_dc(host_row_of(rows, g, i));
          }
          gpu.inc_seqlen();
          model.inc_seqlen();
        }
        gpu.account_steps(g.max_ctx);
        model.account_steps(g.max_ctx);
        EXPECT_TRUE(same_state(gpu, model)) << (windowed ? "append_dcw" : "append_dc");
        EXPECT_TRUE(same_state(gpu, ref))
            << (windowed ? "append_dcw" : "append_dc") << " vs batched reference";
      }
    }
  }
}

/// Prefill-sized batches take the grid-stride path of the kernel.
TEST(CudaAppend, LargeBatchEqualsReference) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xB16);
  const Geometry g = flat(8, 128, 9000);
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    cuda::KvLayer gpu(g, 8, stream.get());
    ref::KvLayer ref(g);
    const HostRows rows = make_rows(g, 8999, t, Fill::random, rng);
    const DeviceRows drows(rows);
    gpu.append(drows.view);
    ref.append(rows.view());
    EXPECT_TRUE(same_state(gpu, ref));
  }
}

/// Every adversarial pattern alone, in every block position of K and V, per dtype.
TEST(CudaAppend, EachAdversarialPatternEqualsReference) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xADE5);
  const Geometry g = flat(1, 64, kPatterns * 4);
  for (DType t : kDTypes) {
    SCOPED_TRACE(dtype_name(t));
    cuda::KvLayer gpu(g, 1, stream.get());
    ref::KvLayer ref(g);
    for (int p = 0; p < kPatterns; ++p) {
      for (int variant = 0; variant < 4; ++variant) {
        std::vector<float> k(std::size_t(g.kv_dim_k())), v(std::size_t(g.kv_dim_v()));
        for (std::size_t b = 0; b < k.size() / 32; ++b)
          adversarial_block(p, rng, k.data() + 32 * b);
        for (std::size_t b = 0; b < v.size() / 32; ++b)
          adversarial_block(p, rng, v.data() + 32 * b);
        const HostRows rows = encode_rows(k, v, 1, t);
        const DeviceRows drows(rows);
        gpu.append(drows.view);
        ref.append(rows.view());
        ASSERT_TRUE(same_state(gpu, ref)) << "pattern " << p << " variant " << variant;
      }
    }
  }
}

/// A few hand-made bad blocks: status() reports the lowest (row, plane, block) with the
/// reference's value, bit for bit; appends after it proceed; clear_status() forgets it.
TEST(CudaAppend, DataErrorsAreReportedLikeTheReference) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xBAD);
  const Geometry g = flat(2, 64, 12);  // 4 blocks per row per plane
  for (DType t : kDTypes) {
    SCOPED_TRACE(dtype_name(t));
    cuda::KvLayer gpu(g, 2, stream.get());
    ref::KvLayer ref(g);
    std::vector<float> k(std::size_t(6 * g.kv_dim_k())), v(std::size_t(6 * g.kv_dim_v()));
    fill_values(k, Fill::random, rng);
    fill_values(v, Fill::random, rng);
    const float nan = std::bit_cast<float>(0x7FC0BEEFu);
    k[std::size_t(4 * g.kv_dim_k() + 2 * 32 + 5)] = nan;         // row 4, K block 2
    v[std::size_t(3 * g.kv_dim_v() + 0 * 32 + 31)] = -INFINITY;  // row 3, V block 0
    v[std::size_t(3 * g.kv_dim_v() + 3 * 32 + 1)] = nan;         // row 3, V block 3
    k[std::size_t(5 * g.kv_dim_k() + 1 * 32 + 7)] = 1e12f;       // row 5, K block 1 (scale)
    const HostRows rows = encode_rows(k, v, 6, t);
    const DeviceRows drows(rows);
    gpu.append(drows.view);
    ref.append(rows.view());
    ASSERT_TRUE(same_state(gpu, ref));
    const LayerStatus st = gpu.status();
    ASSERT_TRUE(st.data_error.has_value());
    EXPECT_EQ(st.data_error->row, 3);
    EXPECT_EQ(st.data_error->plane, Plane::v);
    EXPECT_EQ(st.data_error->block, 0);
    EXPECT_EQ(st.data_error->value, -INFINITY);
    EXPECT_FALSE(st.device_error.has_value());
    EXPECT_EQ(st.message(), ref.status().message());

    // A lower bad row later replaces it (the record keeps the lowest key).
    gpu.rewind(1);
    ref.rewind(1);
    std::vector<float> k1(std::size_t(g.kv_dim_k())), v1(std::size_t(g.kv_dim_v()));
    fill_values(k1, Fill::random, rng);
    fill_values(v1, Fill::random, rng);
    k1[3 * 32] = std::bit_cast<float>(0xFF812345u);  // negative NaN with payload, K block 3
    const HostRows one = encode_rows(k1, v1, 1, t);
    const DeviceRows done(one);
    gpu.append(done.view);
    ref.append(one.view());
    ASSERT_TRUE(same_state(gpu, ref));
    EXPECT_EQ(gpu.status().data_error->row, 1);

    gpu.clear_status();
    ref.clear_status();
    EXPECT_TRUE(gpu.status().ok());
    ASSERT_TRUE(same_state(gpu, ref));
  }
}

/// Data errors from device-counter appends name the logical row len_d, also on a ring where
/// the physical row differs.
TEST(CudaAppend, DeviceCounterDataErrorsNameTheLogicalRow) {
  KVLAYER_REQUIRE_GPU();
  Stream stream;
  Rng rng(0xD0C);
  const Geometry g = ring(1, 64, 500, 20, 4, 2);  // rows = 20 + 4 + 2 + 31 = 57
  cuda::KvLayer gpu(g, 1, stream.get());
  ref::KvLayer ref(g);
  for (int chain = 0; chain < 30; ++chain) {
    const std::int64_t k = 1 + chain % 4;
    gpu.reserve(k);
    ref.reserve(k);
    for (std::int64_t i = 0; i < k; ++i) {
      const HostRows rows = make_rows(g, 1, DType::f32, Fill::adversarial, rng);
      const DeviceRows drows(rows);
      gpu.append_dcw(drows.view);
      ref.append_dcw(rows.view());
      gpu.inc_seqlen();
      ref.inc_seqlen();
    }
    gpu.account_steps(k);
    ref.account_steps(k);
    ASSERT_TRUE(same_state(gpu, ref)) << "chain " << chain;
    gpu.clear_status();
    ref.clear_status();
  }
  EXPECT_GT(gpu.base(), 0) << "the test must cross rebases";
}

}  // namespace
}  // namespace kvlayer::testing
