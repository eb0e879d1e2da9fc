// Shared by the CUDA layer tests: seeded inputs (random and adversarial blocks) in f32/f16/bf16,
// device copies of them, and whole-state comparisons of a cuda::KvLayer with a ref::KvLayer
// (every plane byte, len, base, len_d, base_d, status) that name the first difference.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/status.hpp"
#include "kvlayer/testing/cuda_snapshot.hpp"
#include "kvlayer/testing/geometry.hpp"
#include "kvlayer/testing/gpu.hpp"
#include "kvlayer/testing/head_dims.hpp"
#include "kvlayer/testing/rng.hpp"
#include "kvlayer/testing/rows.hpp"
#include "kvlayer/testing/snapshot.hpp"

namespace kvlayer::testing {

/// Enqueues one device-counter step on `layer` (append one row, inc_seqlen, decode; the windowed
/// variants on a windowed layer) reading fixed input buffers, as a captured decode step does.
inline void device_counter_step(cuda::KvLayer& layer, const cuda::RowsView& row, const float* q,
                                float* out) {
  if (layer.geometry().window) {
    layer.append_dcw(row);
    layer.inc_seqlen();
    layer.decode_dcw(q, out);
  } else {
    layer.append_dc(row);
    layer.inc_seqlen();
    layer.decode_dc(q, out);
  }
}

using cuda::DeviceBuffer;

// ---- inputs --------------------------------------------------------------------------------

/// What the blocks of generated rows hold.
enum class Fill {
  random,              ///< per block a power-of-two scale in [2^-12, 2^12] times uniform(−1, 1)
  adversarial,         ///< per block one of the patterns of adversarial_block (may be bad blocks)
  finite_adversarial,  ///< adversarial patterns that are representable (no bad blocks)
};

inline constexpr int kPatterns = 17;
inline constexpr int kFinitePatterns = 12;  ///< patterns below: representable in f32/bf16

/// One 32-value block of pattern p (0 ≤ p < kPatterns): ties, constants, tiny/subnormal,
/// huge, signed zeros, non-finite values. Patterns ≥ kFinitePatterns make bad blocks (in K, V
/// or both).
inline void adversarial_block(int p, Rng& rng, float* x) {
  const float s = rng.chance(50) ? 1.0f : -1.0f;
  for (int j = 0; j < 32; ++j) x[j] = rng.uniform(-1, 1);
  switch (p) {
    case 0:  // q8_0 ties: amax 127 makes d = 1, so x·id lands on k + 0.5 exactly
      for (int j = 0; j < 32; ++j) x[j] = float(rng.range(-126, 125)) + 0.5f;
      x[rng.range(0, 31)] = 127.0f * s;
      break;
    case 1:  // q5_1 ties: min 0, max 31 makes d = 1, (x − min)·id + 0.5 lands on integers
      for (int j = 0; j < 32; ++j) x[j] = float(rng.range(0, 30)) + 0.5f;
      x[rng.range(0, 15)] = 0.0f;
      x[rng.range(16, 31)] = 31.0f;
      break;
    case 2:  // constant block
      for (int j = 0; j < 32; ++j) x[j] = 3.25f * s;
      break;
    case 3:  // all zeros, both signs
      for (int j = 0; j < 32; ++j) x[j] = rng.chance(50) ? 0.0f : -0.0f;
      break;
    case 4:  // tiny normals: d is subnormal and 1/d overflows (degenerate: quants 0)
      for (int j = 0; j < 32; ++j) x[j] *= 1e-37f;
      break;
    case 5:  // subnormal inputs
      for (int j = 0; j < 32; ++j) x[j] *= 1e-40f;
      break;
    case 6:  // large but representable in both formats: q5_1's d just under 65504
      for (int j = 0; j < 32; ++j) x[j] = -60000.0f + (x[j] + 1.0f) * 0.99e6f;
      break;
    case 7:  // one outlier among small values
      for (int j = 0; j < 32; ++j) x[j] *= 1e-3f;
      x[rng.range(0, 31)] = 1000.0f * s;
      break;
    case 8:  // ties in magnitude: the first index of largest |x| is reported / kept
      for (int j = 0; j < 32; ++j) x[j] = (j % 3 == 0 ? 5.0f : -5.0f);
      break;
    case 9:  // a zero extreme with mixed signs: the sign of q5_1's min/max is the first one's
      for (int j = 0; j < 32; ++j) x[j] = rng.chance(50) ? 0.0f : -0.0f;
      x[rng.range(0, 31)] = 2.0f * s;
      break;
    case 10:  // powers of two across the exponent range
      for (int j = 0; j < 32; ++j) x[j] = std::ldexp(s, int(rng.range(-30, 20)));
      break;
    case 11:  // values near −65504: fp16(min) stays finite
      for (int j = 0; j < 32; ++j) x[j] = -65000.0f + x[j];
      break;
    case 12:  // NaN (with payload)
      x[rng.range(0, 31)] = std::bit_cast<float>(0x7FC01234u | (rng.chance(50) ? 0x80000000u : 0u));
      break;
    case 13:  // ±Inf, sometimes after a NaN
      x[rng.range(16, 31)] = std::numeric_limits<float>::infinity() * s;
      if (rng.chance(30)) x[rng.range(0, 15)] = std::numeric_limits<float>::quiet_NaN();
      break;
    case 14:  // huge: the fp16 scale overflows (q8_0: amax > 127·65519; q5_1: range/31 too)
      for (int j = 0; j < 32; ++j) x[j] *= 3e9f;
      x[rng.range(0, 31)] = 1e10f * s;
      break;
    case 15:  // only q5_1's minimum overflows fp16 (q8_0 is fine)
      for (int j = 0; j < 32; ++j) x[j] = -70000.0f + x[j];
      break;
    case 16:  // q8_0 just below its limit (d = 8.3e6/127 rounds to a finite fp16); q5_1 bad
      for (int j = 0; j < 32; ++j) x[j] *= 8.0e6f;
      x[rng.range(0, 31)] = 8.3e6f * s;
      break;
  }
}

inline void fill_values(std::vector<float>& x, Fill fill, Rng& rng) {
  for (std::size_t b = 0; b < x.size() / 32; ++b) {
    float* blk = x.data() + 32 * b;
    if (fill == Fill::random) {
      const float scale = std::ldexp(1.0f, int(rng.range(-12, 12)));
      for (int j = 0; j < 32; ++j) blk[j] = scale * rng.uniform(-1, 1);
    } else {
      const int limit = fill == Fill::adversarial ? kPatterns : kFinitePatterns;
      // Mostly random blocks, so that bad blocks stay rare within a row.
      const int p = rng.chance(60) ? int(rng.range(0, limit - 1)) : -1;
      if (p < 0) {
        for (int j = 0; j < 32; ++j) blk[j] = rng.uniform(-4, 4);
      } else {
        adversarial_block(p, rng, blk);
      }
    }
  }
}

/// n random rows for geometry g, encoded as t.
inline HostRows make_rows(const Geometry& g, std::int64_t n, DType t, Fill fill, Rng& rng) {
  std::vector<float> k(std::size_t(n * g.kv_dim_k())), v(std::size_t(n * g.kv_dim_v()));
  fill_values(k, fill, rng);
  fill_values(v, fill, rng);
  return encode_rows(std::move(k), std::move(v), n, t);
}

/// A device copy of HostRows' encoded bytes (synchronous upload). k_skip / v_skip: elements
/// left before the rows, so that the views start off the allocation's alignment (the append's
/// scalar path).
struct DeviceRows {
  DeviceBuffer k, v;
  cuda::RowsView view;
  explicit DeviceRows(const HostRows& h, std::size_t k_skip = 0, std::size_t v_skip = 0)
      : k(h.k_bytes.size() + k_skip * dtype_size(h.dtype) + 1),
        v(h.v_bytes.size() + v_skip * dtype_size(h.dtype) + 1) {
    std::uint8_t* kd = k.as<std::uint8_t>() + k_skip * dtype_size(h.dtype);
    std::uint8_t* vd = v.as<std::uint8_t>() + v_skip * dtype_size(h.dtype);
    KVLAYER_CUDA_TRY(cudaMemcpy(kd, h.k_bytes.data(), h.k_bytes.size(), cudaMemcpyHostToDevice));
    KVLAYER_CUDA_TRY(cudaMemcpy(vd, h.v_bytes.data(), h.v_bytes.size(), cudaMemcpyHostToDevice));
    // NOTE: a pageable cudaMemcpy may return before its DMA lands, and the layers' streams are
    // non-blocking (no implicit order with the legacy stream): wait for it.
    KVLAYER_CUDA_TRY(cudaDeviceSynchronize());
    view = cuda::RowsView{kd, vd, h.n, h.dtype};
  }
  /// Work enqueued on any stream may still read the rows: let it finish before cudaFree.
  ~DeviceRows() { (void)cudaDeviceSynchronize(); }
  DeviceRows(const DeviceRows&) = delete;
  DeviceRows& operator=(const DeviceRows&) = delete;
};

/// f32 on the device.
struct DeviceFloats {
  DeviceBuffer buf;
  std::size_t count;
  explicit DeviceFloats(std::size_t n) : buf(n * sizeof(float)), count(n) {}
  ~DeviceFloats() { (void)cudaDeviceSynchronize(); }  // see ~DeviceRows
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return buf.as<float>(); }
  void upload(const std::vector<float>& x) {
    KVLAYER_CUDA_TRY(cudaMemcpy(buf.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    KVLAYER_CUDA_TRY(cudaDeviceSynchronize());  // see DeviceRows
  }
  /// Fills with 0xFF bytes (a NaN) so that an unwritten element cannot pass; stream-ordered.
  void poison(cudaStream_t s) { KVLAYER_CUDA_TRY(cudaMemsetAsync(buf.get(), 0xFF, count * 4, s)); }
  std::vector<float> download(cudaStream_t s) const {
    std::vector<float> out(count);
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(out.data(), buf.get(), count * 4, cudaMemcpyDeviceToHost, s));
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(s));
    return out;
  }
};

// ---- state comparison ------------------------------------------------------------------------

inline std::string status_text(const LayerStatus& s) {
  std::ostringstream o;
  o << s.message();
  if (s.data_error)
    o << " [value bits 0x" << std::hex << std::bit_cast<std::uint32_t>(s.data_error->value) << "]";
  return o.str();
}

/// The first differing byte of two planes, as "row r, block b, byte i: 0xAA vs 0xBB".
inline std::string first_plane_difference(const std::vector<std::uint8_t>& a,
                                          const std::vector<std::uint8_t>& b,
                                          std::int64_t tok_bytes, int block_bytes) {
  if (a.size() != b.size())
    return "sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  const auto m = std::mismatch(a.begin(), a.end(), b.begin());
  if (m.first == a.end()) return {};
  const std::int64_t at = m.first - a.begin();
  std::size_t count = 0;
  for (std::size_t i = std::size_t(at); i < a.size(); ++i) count += a[i] != b[i];
  std::ostringstream o;
  o << "physical row " << at / tok_bytes << ", block " << (at % tok_bytes) / block_bytes
    << ", byte " << (at % tok_bytes) % block_bytes << ": 0x" << std::hex << int(*m.first)
    << " vs 0x" << int(*m.second) << std::dec << " (" << count << " bytes differ)";
  return o.str();
}

/// Compares the GPU state (a) with the reference's (b).
inline ::testing::AssertionResult same_state(const Snapshot& a, const Snapshot& b,
                                             const Geometry& g) {
  std::ostringstream o;
  const auto dk = first_plane_difference(a.k_plane, b.k_plane, g.k_tok_bytes(), kQ8_0BlockBytes);
  const auto dv = first_plane_difference(a.v_plane, b.v_plane, g.v_tok_bytes(), kQ5_1BlockBytes);
  if (!dk.empty()) o << "K plane differs at " << dk << "; ";
  if (!dv.empty()) o << "V plane differs at " << dv << "; ";
  if (a.len != b.len) o << "len " << a.len << " vs " << b.len << "; ";
  if (a.base != b.base) o << "base " << a.base << " vs " << b.base << "; ";
  if (a.len_d != b.len_d) o << "len_d " << a.len_d << " vs " << b.len_d << "; ";
  if (a.base_d != b.base_d) o << "base_d " << a.base_d << " vs " << b.base_d << "; ";
  if (!same_status(a.status, b.status))
    o << "status \"" << status_text(a.status) << "\" vs \"" << status_text(b.status) << "\"; ";
  if (o.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "GPU vs reference (" << g.describe() << "): " << o.str();
}

inline ::testing::AssertionResult same_state(const cuda::KvLayer& gpu, const ref::KvLayer& ref) {
  return same_state(snapshot(gpu), snapshot(ref), ref.geometry());
}

/// The message of the kvlayer::Error (refused) that f throws, or "" if it throws nothing.
/// Any other exception or error kind fails the test.
inline std::string refusal_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::refused) << e.what();
    return e.what();
  }
  return {};
}

/// The message of the kvlayer::Error (device) that f throws, or "" if it throws none. Any other
/// exception or error kind fails the test.
inline std::string device_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::device) << e.what();
    return e.what();
  }
  return {};
}

// ---- geometries -------------------------------------------------------------------------------

/// geometry.hpp's geometries with head_dim_k = head_dim_v = hd.
inline Geometry flat(int n_kv, int hd, std::int64_t max_ctx,
                     std::optional<std::int64_t> window = std::nullopt) {
  return flat_geometry(n_kv, hd, hd, max_ctx, window);
}

inline Geometry ring(int n_kv, int hd, std::int64_t max_ctx, std::int64_t window,
                     std::int64_t max_append, std::int64_t rewind_slack) {
  return ring_geometry(n_kv, hd, hd, max_ctx, window, max_append, rewind_slack);
}

inline constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace kvlayer::testing
