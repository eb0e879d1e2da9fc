// Host rows for an append: the f32 values and their encoding in an input dtype, as the
// reference tests, the CUDA tests and the harness hand them to a layer.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlayer/dtype.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer::testing {

/// n rows of K (kv_dim_k values each) and V (kv_dim_v), row-major. encode_rows keeps the two
/// forms in step; a test that edits one form afterwards appends that form (f32_view() after
/// editing k or v, view() after editing k_bytes or v_bytes).
struct HostRows {
  std::int64_t n = 0;
  DType dtype = DType::f32;
  std::vector<float> k, v;                     ///< the values as f32 (exactly what dtype holds)
  std::vector<std::uint8_t> k_bytes, v_bytes;  ///< the same values encoded as dtype

  /// The encoded rows, as an append in dtype reads them.
  ref::RowsView view() const { return {k_bytes.data(), v_bytes.data(), n, dtype}; }
  /// The f32 values, as an f32 append reads them (whatever dtype is).
  ref::RowsView f32_view() const { return {k.data(), v.data(), n, DType::f32}; }
  /// Row i's f32 K (or V) values.
  std::vector<float> row(Plane p, std::int64_t i, const Geometry& g) const;
};

/// Rounds x to what dtype holds and writes its encoding (dtype_size(dtype) bytes) to out;
/// returns the rounded value.
float encode_value(float x, DType dtype, std::uint8_t* out);

/// n rows holding k and v rounded to dtype, and their encoding.
HostRows encode_rows(std::vector<float> k, std::vector<float> v, std::int64_t n, DType dtype);

/// The values of `rows` in another dtype (exact only where dtype holds them).
HostRows with_dtype(const HostRows& rows, DType dtype);

/// Rows [first, first + count) of `rows` (both forms).
HostRows slice(const HostRows& rows, const Geometry& g, std::int64_t first, std::int64_t count);

}  // namespace kvlayer::testing
