// The CUDA layer's state as a Snapshot (snapshot.hpp). Header-only: each user links the layer
// build it tests (kvlayer_cuda, or kvlayer_cuda_fault instead of it).
#pragma once

#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/testing/snapshot.hpp"

namespace kvlayer::testing {

/// Whether a GPU snapshot also reads the planes' tail padding (one more copy per plane).
enum class Tails { skip, read };

/// Reads back the GPU layer's state: planes, [tails,] len, base, len_d, base_d, status, in that
/// order.
inline Snapshot snapshot(const cuda::KvLayer& layer, Tails tails = Tails::skip) {
  Snapshot s;
  s.k_plane = layer.k_plane_bytes();
  s.v_plane = layer.v_plane_bytes();
  if (tails == Tails::read) {
    s.k_tail = layer.k_plane_tail_bytes();
    s.v_tail = layer.v_plane_tail_bytes();
  }
  s.len = layer.len();
  s.base = layer.base();
  s.len_d = layer.read_len_d();
  s.base_d = layer.read_base_d();
  s.status = layer.status();
  return s;
}

}  // namespace kvlayer::testing
