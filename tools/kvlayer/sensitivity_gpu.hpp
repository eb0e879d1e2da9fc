// The CUDA layer's side of `kvlayer sensitivity --gpu`: a layer holding the same rows as the
// sweep's reference layer, decoded once per configuration, so that the planted errors land on
// top of the GPU's own rounding. Only in CUDA builds (KVLAYER_WITH_CUDA).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvlayer/accuracy.hpp"
#include "kvlayer/geometry.hpp"

namespace kvlayer::cli {

class GpuDecode {
 public:
  /// A layer taking verify decodes of up to max_verify rows.
  GpuDecode(const Geometry& g, int n_q_heads, int max_verify);
  ~GpuDecode();
  /// Appends n host f32 rows (k [n, kv_dim_k], v [n, kv_dim_v]).
  void append(const float* k, const float* v, std::int64_t n);
  /// T = 1: the decode of q [n_q_heads, head_dim_k] over the whole layer (host len); T ≥ 2:
  /// the verify decode of q [T, n_q_heads, head_dim_k]. Synchronized; [T, n_q_heads,
  /// head_dim_v].
  std::vector<float> decode_rows(std::span<const float> q, int t);
  /// The launches' accumulation shapes, for the bound.
  AccumulationShape accumulation_shape() const;
  AccumulationShape verify_accumulation_shape(int t) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvlayer::cli
