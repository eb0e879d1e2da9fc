// The CUDA KvLayer's private state (its pimpl), shared by the translation units that define the
// layer's members: kv_layer.cpp (construction, appends, counters, decode, read-back) and
// snapshot.cpp (snapshot and restore).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "append_kernel.hpp"
#include "counters.hpp"
#include "decode/decode.hpp"
#include "device_status.cuh"
#include "kvlayer/accuracy.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "mutants.hpp"
#include "rebase.hpp"
#include "ring_plan.hpp"

namespace kvlayer::cuda {

struct KvLayer::State {
  Geometry g;
  int n_q_heads = 0;
  int max_verify = 0;
  DecodeOptions decode_options;
  cudaStream_t stream = nullptr;
  int device = 0;  ///< current at construction; made current by every call that touches CUDA
  std::int64_t rows = 0;
  detail::DecodePlan decode_plan;
  // NOTE: every buffer a captured graph may hold is allocated here, once, and never replaced
  // while the layer lives (SPEC §7).
  DeviceBuffer k_plane, v_plane;
  DeviceBuffer counters;  ///< int32[2]: len_d, base_d
  DeviceBuffer status;    ///< DeviceStatus
  DeviceBuffer scratch;   ///< decode split scratch
  std::int64_t len = 0, base = 0;
  /// No state-changing call accepted since construction (kv_layer.hpp, fresh()): a restore
  /// needs all-zero planes and counters.
  bool fresh = true;
  bool after_rows_step = false;  ///< the last device-counter append wrote T > 1 rows (mutants)

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // NOTE: work still queued may use the buffers, also when the constructor threw after
  // enqueueing the memsets: wait for it before they are freed (errors are ignored: a destructor
  // cannot report them). Nothing is queued before the first allocation.
  ~State() {
    if (k_plane.get() != nullptr) (void)cudaStreamSynchronize(stream);
  }

  std::int32_t* len_d() const { return counters.as<std::int32_t>(); }
  std::int32_t* base_d() const { return counters.as<std::int32_t>() + 1; }
  detail::DeviceStatus* dstatus() const { return status.as<detail::DeviceStatus>(); }

  // ---- refusals (host only, before any device work) ----

  void check_rows(const RowsView& r, const char* op) const {
    if (r.k == nullptr || r.v == nullptr) refuse(op, "k and v must not be null");
    if (r.n < 1) refuse(op, "n ", r.n, " must be at least 1");
    if (r.dtype != DType::f32 && r.dtype != DType::f16 && r.dtype != DType::bf16)
      refuse(op, "dtype ", int(r.dtype), " is not f32, f16 or bf16");
    const auto align = static_cast<std::uintptr_t>(dtype_size(r.dtype));
    if (reinterpret_cast<std::uintptr_t>(r.k) % align != 0 ||
        reinterpret_cast<std::uintptr_t>(r.v) % align != 0)
      refuse(op, "k and v must be aligned to their ", align, "-byte ", dtype_name(r.dtype),
             " elements");
  }

  void check_one_row(const RowsView& r, const char* op) const {
    check_rows(r, op);
    if (r.n != 1) refuse(op, "n ", r.n, " must be 1");
  }

  /// T of a multi-row step or a verify decode (SPEC §11).
  void check_verify_count(std::int64_t t, const char* op) const {
    if (t < 1) refuse(op, "T ", t, " must be at least 1");
    if (t > max_verify) refuse(op, "T ", t, " exceeds max_verify ", max_verify);
  }

  static void check_decode_pointers(const float* q, const float* out, const char* op) {
    if (q == nullptr || out == nullptr) refuse(op, "q and out must not be null");
  }

  detail::Placement place(std::int64_t n, const char* op) const {
    detail::Placement p = detail::place_rows(g, len, base, n, op);
    // (planted bug: a rebase moves base by one 32-row unit however far the plan moves it, where
    // the append still fits)
    if (KVLAYER_HOST_MUTANT(rebase_moves_one_unit) && p.rebase && p.retain - base > kRingAlign &&
        len - (base + kRingAlign) + n <= rows) {
      p.retain = base + kRingAlign;
      p.keep = p.write_row = len - p.retain;
    }
    return p;
  }

  // ---- device work ----

  void set_counters(std::int64_t new_len, std::int64_t new_base) {
    KVLAYER_CUDA_TRY_NAMED(
        detail::launch_set_counters(len_d(), base_d(), new_len, new_base, stream),
        "launch_set_counters");
  }

  /// Moves the kept rows to the front of both planes, then base = base_d = retain. A CUDA
  /// failure leaves everything as it was (base_d is restored after a failed move).
  void apply(const detail::Placement& p) {
    if (!p.rebase) return;
    const std::int64_t shift = p.retain - base;  // > 0: a rebase always drops rows
    // base_d first: a failed move can then be undone by writing base_d back, whereas a move
    // that ran cannot (it overwrites the dropped rows).
    const bool update_base_d = !KVLAYER_HOST_MUTANT(base_d_not_updated);
    if (update_base_d) set_counters(-1, p.retain);
    if (shift > 0 && p.keep > 0) {
      // (planted bug: the move forgets the last kept row)
      const std::int64_t moved = KVLAYER_HOST_MUTANT(rebase_off_by_one) ? p.keep - 1 : p.keep;
      const detail::PlaneMove k{k_plane.as<std::uint8_t>(), shift * g.k_tok_bytes(),
                                moved * g.k_tok_bytes()};
      const detail::PlaneMove v{v_plane.as<std::uint8_t>(), shift * g.v_tok_bytes(),
                                moved * g.v_tok_bytes()};
      try {
        KVLAYER_CUDA_TRY_NAMED(detail::launch_rebase(k, v, stream), "launch_rebase");
      } catch (const Error& failure) {
        if (update_base_d) restore_base_d(failure);
        throw;
      }
    }
    base = p.retain;
  }

  /// After a failed move: base_d = base again. Should that fail too, the CUDA context is most
  /// likely broken (a sticky error) and base_d may be stale: the message says so.
  void restore_base_d(const Error& failure) {
    try {
      set_counters(-1, base);
    } catch (const Error& e) {
      throw Error(ErrorKind::device, std::string(failure.what()) +
                                         "; restoring base_d failed too (" + e.what() +
                                         "): the layer is unusable");
    }
  }

  detail::AppendArgs append_args(const RowsView& r) const {
    detail::AppendArgs a;
    a.k = r.k;
    a.v = r.v;
    a.dtype = r.dtype;
    a.n = r.n;
    a.kv_dim_k = g.kv_dim_k();
    a.kv_dim_v = g.kv_dim_v();
    a.k_plane = k_plane.as<std::uint8_t>();
    a.v_plane = v_plane.as<std::uint8_t>();
    a.k_tok_bytes = g.k_tok_bytes();
    a.v_tok_bytes = g.v_tok_bytes();
    a.len_d = len_d();
    a.base_d = base_d();
    a.rows = rows;
    a.max_ctx = g.max_ctx;
    a.status = dstatus();
    return a;
  }

  /// Where a decode launch reads its view's length (and base) from.
  enum class ViewSource {
    host,              ///< the host len and base (decode, decode_rows)
    len_d,             ///< len_d, base 0 (decode_dc, decode_rows_dc)
    len_d_and_base_d,  ///< len_d and base_d (decode_dcw, decode_rows_dcw)
  };

  void decode(const float* q, float* out, std::optional<float> scale, ViewSource view,
              int queries = 0) {
    detail::DecodeArgs a;
    a.queries = queries;
    a.k_plane = k_plane.as<std::uint8_t>();
    a.v_plane = v_plane.as<std::uint8_t>();
    a.rows = rows;
    a.max_ctx = g.max_ctx;
    a.window = g.window.value_or(0);
    if (view != ViewSource::host) {
      a.len_d = len_d();
      a.base_d = view == ViewSource::len_d_and_base_d ? base_d() : nullptr;
    } else {
      a.host_len = len;
      a.host_base = base;
    }
    a.q = q;
    a.out = out;
    a.scale = scale.value_or(detail::default_scale_mutant(kvlayer::default_scale(g.head_dim_k)));
    a.scratch = scratch.get();
    a.status = dstatus();
    KVLAYER_CUDA_TRY_NAMED(detail::launch_decode(a, decode_plan, stream), "launch_decode");
  }

  template <typename T>
  void read(T* host, const void* device, std::size_t bytes) const {
    KVLAYER_CUDA_TRY_NAMED(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream),
                           "cudaMemcpyAsync (device to host)");
    KVLAYER_CUDA_TRY_NAMED(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

}  // namespace kvlayer::cuda
