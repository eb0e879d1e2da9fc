// What the CUDA layer's kernels are built for: the one table of its limits, from which the
// layer, the planner and the launch check their inputs and build their refusal messages.
#pragma once

#include <string>

namespace kvlayer::cuda {

/// Head dims the CUDA kernels are built for (K and V equal).
inline constexpr int kSupportedHeadDims[] = {64, 128, 256};
/// Largest supported n_q_heads / n_kv_heads (query rows of one mma tile).
inline constexpr int kMaxGqa = 16;
/// Largest n_kv_heads (the decode grid's y dimension).
inline constexpr int kMaxKvHeads = 65535;
/// max_verify of a layer constructed without one (SPEC §11: at least 16 supported).
inline constexpr int kDefaultMaxVerify = 16;
/// Largest supported max_verify (verify row blocks: up to kMaxVerify · kMaxGqa rows).
inline constexpr int kMaxVerify = 64;

/// Whether head_dim is one of kSupportedHeadDims.
constexpr bool head_dim_supported(int head_dim) {
  for (const int d : kSupportedHeadDims)
    if (d == head_dim) return true;
  return false;
}

/// kSupportedHeadDims as refusal messages name them: "64, 128, 256".
inline std::string supported_head_dims() {
  std::string s;
  for (const int d : kSupportedHeadDims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

}  // namespace kvlayer::cuda
