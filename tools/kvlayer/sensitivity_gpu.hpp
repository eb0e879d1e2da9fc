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
  GpuDecode(const Geometry& g, int n_q_heads);
  ~GpuDecode();
  /// Appends n host f32 rows (k [n, kv_dim_k], v [n, kv_dim_v]).
  void append(const float* k, const float* v, std::int64_t n);
  /// The decode of q [n_q_heads, head_dim_k] over the whole layer (host len), synchronized.
  std::vector<float> decode(std::span<const float> q);
  /// The launch's accumulation shape, for the bound.
  AccumulationShape accumulation_shape() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvlayer::cli
