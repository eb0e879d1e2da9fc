// One engine decode step on device counters, for `kvlayer bench` and `kvlayer soak`.
#pragma once

#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/cuda/kv_layer.hpp"

namespace kvlayer::cli {

/// append_dc(row) → inc_seqlen → decode_dc(q, out); the windowed variants (append_dcw,
/// decode_dcw) on a layer with a window. Enqueued on the layer's stream.
void decode_step(cuda::KvLayer& layer, const cuda::RowsView& row, const float* q, float* out);

/// decode_step captured once as a graph on the layer's stream (synchronized first).
cuda::Graph capture_decode_step(cuda::KvLayer& layer, const cuda::RowsView& row,
                                        const float* q, float* out);

}  // namespace kvlayer::cli
