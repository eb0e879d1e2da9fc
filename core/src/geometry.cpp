#include "kvlayer/geometry.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "kvlayer/error.hpp"

namespace kvlayer {

std::int64_t Geometry::rows() const {
  if (!is_ring()) return max_ctx;
  return std::min(max_ctx, *window + max_append + rewind_slack + kRingAlign - 1);
}

void Geometry::validate() const {
  constexpr const char* op = "geometry";
  // Bounds that keep every derived size far from overflow; far beyond any real model.
  constexpr int kMaxHeads = 4096, kMaxHeadDim = 4096;
  constexpr std::int64_t kMaxCtx = std::numeric_limits<std::int32_t>::max();
  if (n_kv_heads < 1 || n_kv_heads > kMaxHeads)
    refuse(op, "n_kv_heads ", n_kv_heads, " is outside [1, ", kMaxHeads, "]");
  for (auto [name, hd] : {std::pair{"head_dim_k", head_dim_k}, std::pair{"head_dim_v", head_dim_v}})
    if (hd < kBlockValues || hd > kMaxHeadDim || hd % kBlockValues != 0)
      refuse(op, name, " ", hd, " must be a positive multiple of ", kBlockValues, " up to ",
             kMaxHeadDim);
  if (max_ctx < 1 || max_ctx > kMaxCtx)
    refuse(op, "max_ctx ", max_ctx, " is outside [1, ", kMaxCtx, "] (device counters are int32)");
  if (window && (*window < 1 || *window > kMaxCtx))
    refuse(op, "window ", *window, " is outside [1, ", kMaxCtx, "]");
  if (is_ring()) {
    if (!window) refuse(op, "ring storage requires a window");
    if (max_append < 1 || max_append > kMaxCtx)
      refuse(op, "max_append ", max_append, " is outside [1, ", kMaxCtx, "]");
    if (rewind_slack < 0 || rewind_slack > kMaxCtx)
      refuse(op, "rewind_slack ", rewind_slack, " is outside [0, ", kMaxCtx, "]");
  }
}

std::string Geometry::describe() const {
  std::ostringstream s;
  s << (is_ring() ? "ring " : "flat ") << n_kv_heads << "x" << head_dim_k << "/" << head_dim_v
    << " max_ctx " << max_ctx;
  if (window) s << " window " << *window;
  if (is_ring())
    s << " max_append " << max_append << " rewind_slack " << rewind_slack << " rows " << rows();
  return s.str();
}

}  // namespace kvlayer
