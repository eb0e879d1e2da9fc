#include "decode_step.hpp"

#include <cuda_runtime_api.h>

#include "kvlayer/cuda/runtime.hpp"

namespace kvlayer::cli {

void decode_step(cuda::KvLayer& layer, const cuda::RowsView& row, const float* q, float* out) {
  const bool windowed = layer.geometry().window.has_value();
  windowed ? layer.append_dcw(row) : layer.append_dc(row);
  layer.inc_seqlen();
  windowed ? layer.decode_dcw(q, out) : layer.decode_dc(q, out);
}

cuda::Graph capture_decode_step(cuda::KvLayer& layer, const cuda::RowsView& row,
                                        const float* q, float* out) {
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(layer.stream()));
  KVLAYER_CUDA_TRY(cudaStreamBeginCapture(layer.stream(), cudaStreamCaptureModeThreadLocal));
  decode_step(layer, row, q, out);
  return cuda::Graph::end_capture(layer.stream());
}

}  // namespace kvlayer::cli
