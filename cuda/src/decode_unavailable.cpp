// TEMPORARY stand-in for cuda/src/decode/ (kvlayer_cuda_decode), compiled only while that
// library is missing (cuda/CMakeLists.txt), so that the layer and its tests build. Planning
// yields a one-split plan; every launch fails with cudaErrorNotSupported.
#include "decode/decode.hpp"

namespace kvlayer::cuda::detail {

DecodePlan plan_decode(int n_kv_heads, int head_dim, int gqa, std::int64_t max_view_keys, int) {
  DecodePlan p;
  p.n_kv_heads = n_kv_heads;
  p.head_dim = head_dim;
  p.gqa = gqa;
  p.max_view_keys = max_view_keys;
  p.n_splits = 1;
  p.max_keys_per_split = max_view_keys;
  p.scratch_bytes = 0;
  return p;
}

cudaError_t launch_decode(const DecodeArgs&, const DecodePlan&, cudaStream_t) {
  return cudaErrorNotSupported;
}

}  // namespace kvlayer::cuda::detail
