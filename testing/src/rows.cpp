#include "kvlayer/testing/rows.hpp"

#include <cstring>
#include <utility>

#include "kvlayer/half.hpp"

namespace kvlayer::testing {
namespace {

void encode_plane(std::vector<float>& values, std::vector<std::uint8_t>& bytes, DType dtype) {
  const std::size_t es = dtype_size(dtype);
  bytes.assign(values.size() * es, 0);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = encode_value(values[i], dtype, bytes.data() + i * es);
}

}  // namespace

std::vector<float> HostRows::row(Plane p, std::int64_t i, const Geometry& g) const {
  const std::int64_t dim = p == Plane::k ? g.kv_dim_k() : g.kv_dim_v();
  const auto& src = p == Plane::k ? k : v;
  return {src.begin() + i * dim, src.begin() + (i + 1) * dim};
}

float encode_value(float x, DType dtype, std::uint8_t* out) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(out, &x, 4);
      return x;
    case DType::f16: {
      const std::uint16_t h = f32_to_f16_bits(x);
      std::memcpy(out, &h, 2);
      return f16_bits_to_f32(h);
    }
    case DType::bf16: {
      const std::uint16_t b = f32_to_bf16_bits(x);
      std::memcpy(out, &b, 2);
      return bf16_bits_to_f32(b);
    }
  }
  return x;
}

HostRows encode_rows(std::vector<float> k, std::vector<float> v, std::int64_t n, DType dtype) {
  HostRows rows;
  rows.n = n;
  rows.dtype = dtype;
  rows.k = std::move(k);
  rows.v = std::move(v);
  encode_plane(rows.k, rows.k_bytes, dtype);
  encode_plane(rows.v, rows.v_bytes, dtype);
  return rows;
}

HostRows with_dtype(const HostRows& rows, DType dtype) {
  return encode_rows(rows.k, rows.v, rows.n, dtype);
}

HostRows slice(const HostRows& rows, const Geometry& g, std::int64_t first, std::int64_t count) {
  const std::int64_t dk = g.kv_dim_k(), dv = g.kv_dim_v();
  const std::int64_t es = std::int64_t(dtype_size(rows.dtype));
  HostRows s;
  s.n = count;
  s.dtype = rows.dtype;
  s.k.assign(rows.k.begin() + first * dk, rows.k.begin() + (first + count) * dk);
  s.v.assign(rows.v.begin() + first * dv, rows.v.begin() + (first + count) * dv);
  s.k_bytes.assign(rows.k_bytes.begin() + first * dk * es,
                   rows.k_bytes.begin() + (first + count) * dk * es);
  s.v_bytes.assign(rows.v_bytes.begin() + first * dv * es,
                   rows.v_bytes.begin() + (first + count) * dv * es);
  return s;
}

}  // namespace kvlayer::testing
