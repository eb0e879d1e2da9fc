// cuda::KvLayer::snapshot and restore (SPEC §13): the live rows downloaded from the planes, and
// uploaded into a fresh layer at the restore plan's base, on the layer's stream.
// NOTE: host code only (copies and the counters' launcher); the refusal messages are the
// reference's (reference/src/snapshot.cpp), word for word, and every CUDA call is checked through
// KVLAYER_CUDA_TRY_NAMED so that the fault-injection build can fail each one.
#include <cstdint>
#include <string>

#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "layer_state.hpp"
#include "mutants.hpp"

namespace kvlayer::cuda {

Snapshot KvLayer::snapshot() const {
  const State& s = *s_;
  const DeviceGuard on(s.device);
  const Geometry& g = s.g;
  // The host len says which rows are live only when every replayed step was accounted for.
  const std::int64_t len_d = read_len_d();
  if (len_d != s.len)
    refuse("snapshot", "len_d ", len_d, " != len ", s.len,
           " (account for replayed device-counter steps with account_steps first)");
  const std::int64_t first = snapshot_first(g, s.len);
  if (first < s.base)
    refuse("snapshot", "first row ", first, " (len ", s.len, ", window ", g.window.value_or(0),
           ") is below base ", s.base, ": the ring no longer holds it (lapped)");
  Snapshot out;
  out.geometry = g;
  out.len = s.len;
  out.first = first;
  out.base = s.base;
  out.k.resize(std::size_t(out.rows() * g.k_tok_bytes()));
  out.v.resize(std::size_t(out.rows() * g.v_tok_bytes()));
  const std::int64_t physical = first - s.base;
  if (out.rows() > 0) {
    s.read(out.k.data(), s.k_plane.as<std::uint8_t>() + physical * g.k_tok_bytes(), out.k.size());
    s.read(out.v.data(), s.v_plane.as<std::uint8_t>() + physical * g.v_tok_bytes(), out.v.size());
  }
  return out;
}

void KvLayer::restore(const Snapshot& snap) {
  State& s = *s_;
  const DeviceGuard on(s.device);
  const Geometry& g = s.g;
  check_restore(snap, g, "restore");
  if (!s.fresh)
    refuse("restore",
           "the layer is not fresh (an append, rewind, reserve, device-counter step, "
           "account_steps or restore was accepted since its construction); restore "
           "into a newly constructed layer");
  const std::int64_t base = g.is_ring() ? snap.first : 0;
  // (planted bug: the rows copied to where the source ring held them, first − its base, as if
  // they began at base; inside the plane, as they were there)
  const bool from_base = snap.first > snap.base && snap.len - snap.base <= g.rows() &&
                         KVLAYER_HOST_MUTANT(restore_copies_from_base);
  const std::int64_t physical = snap.first - (from_base ? snap.base : base);
  std::uint8_t* const k_dst = s.k_plane.as<std::uint8_t>() + physical * g.k_tok_bytes();
  std::uint8_t* const v_dst = s.v_plane.as<std::uint8_t>() + physical * g.v_tok_bytes();
  try {
    // NOTE: the snapshot's pageable memory may be staged asynchronously: the final
    // synchronization keeps the caller from freeing it early, and from seeing len before the
    // counters.
    if (snap.rows() > 0) {
      KVLAYER_CUDA_TRY_NAMED(
          cudaMemcpyAsync(k_dst, snap.k.data(), snap.k.size(), cudaMemcpyHostToDevice, s.stream),
          "cudaMemcpyAsync (host to device)");
      KVLAYER_CUDA_TRY_NAMED(
          cudaMemcpyAsync(v_dst, snap.v.data(), snap.v.size(), cudaMemcpyHostToDevice, s.stream),
          "cudaMemcpyAsync (host to device)");
    }
    // (planted bugs: len_d left at 0, base_d not restored; -1 leaves a counter as it is)
    const bool leave_len_d = snap.len > 0 && KVLAYER_HOST_MUTANT(restore_leaves_len_d_zero);
    const bool leave_base_d = base > 0 && KVLAYER_HOST_MUTANT(restore_leaves_base_d);
    s.set_counters(leave_len_d ? -1 : snap.len, leave_base_d ? -1 : base);
    KVLAYER_CUDA_TRY_NAMED(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
  } catch (const Error& failure) {
    // A fresh layer's planes and counters were all zero: writing zeros undoes any copy that ran.
    try {
      if (snap.rows() > 0) {
        KVLAYER_CUDA_TRY(cudaMemsetAsync(k_dst, 0, snap.k.size(), s.stream));
        KVLAYER_CUDA_TRY(cudaMemsetAsync(v_dst, 0, snap.v.size(), s.stream));
      }
      s.set_counters(0, 0);
      KVLAYER_CUDA_TRY_NAMED(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
    } catch (const Error& e) {
      throw Error(ErrorKind::device, std::string(failure.what()) +
                                         "; undoing the partial restore failed too (" + e.what() +
                                         "): the layer is unusable");
    }
    throw;
  }
  s.len = snap.len;
  s.base = base;
  s.fresh = false;
}

bool KvLayer::fresh() const {
  return s_->fresh;
}

}  // namespace kvlayer::cuda
