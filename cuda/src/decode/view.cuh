// The view a launch attends (SPEC §8, §11): resolved on the device (device-counter mode) or from
// the host values, its device-mode checks, a split's end and a verify row's bounds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "decode/view_begin.hpp"
#include "mutants.cuh"

namespace kvlayer::cuda::detail::decode_impl {

/// The view a launch attends, resolved on the device (device-counter mode) or from the host
/// values. Passed by value so a captured graph holds only pointers and layer constants.
struct ViewParams {
  const std::int32_t* len_d;  ///< null: host mode
  const std::int32_t* base_d;
  long long host_len, host_base;
  long long window, rows, max_ctx, max_view;
  /// 0: a decode (one query at len). T ≥ 1: a verify decode (SPEC §11): T queries at
  /// len − T … len − 1, each with its own causal window; the launch attends their union.
  long long queries;
};

struct View {
  long long begin, end, base;  ///< logical [begin, end) at physical row = logical − base
  long long len, limit;        ///< for the error record
  bool error;
};

/// Resolves and (device mode) checks the view, in the reference's order: len_d past max_ctx
/// (limit max_ctx), then outside the resident rows (limit rows), then longer than the grid
/// (limit max_view_keys). Host-mode views were checked on the host before the launch.
/// NOTE: a negative len_d or base_d (impossible through the layer API) is treated as outside.
/// `site` names the calling kernel for the planted mutants' reach report.
__device__ inline View resolve_view(const ViewParams& p, MutantSite site) {
  View v{};
  long long base = p.host_base;
  v.len = p.host_len;
  if (p.len_d != nullptr) {
    v.len = *p.len_d;
    base = p.base_d != nullptr ? *p.base_d : 0;
  }
  v.base = base;
  v.end = v.len;
  v.begin = view_begin(v.len, p.queries, p.window);
  if (KVLAYER_DEVICE_MUTANT(decode_window_off_by_one) && p.window > 0 && v.begin < v.len) {
    ++v.begin;  // planted bug: one key too few
    KVLAYER_MUTANT_REACHED(site);
  }
  if (p.len_d != nullptr) {
    if (v.len < 0 || v.len > p.max_ctx) {
      v.error = true;
      v.limit = p.max_ctx;
    } else if (p.queries > 0 && v.len < p.queries) {
      v.error = true;  // fewer keys than verified queries: no causal view for query 0
      v.limit = p.queries;
    } else if (base < 0 || v.begin < base || v.len - base > p.rows) {
      v.error = true;
      v.limit = p.rows;
    } else if (v.end - v.begin > p.max_view) {
      v.error = true;
      v.limit = p.max_view;
    }
  }
  if (KVLAYER_DEVICE_MUTANT(decode_reads_past_view) && !v.error && v.end - base < p.rows) {
    ++v.end;  // planted bug: one (stale) row past the view, never past the plane
    KVLAYER_MUTANT_REACHED(site);
  }
  return v;
}

/// End of the keys [lo, ·) a split attends: lo + kps, clipped to the view.
__device__ inline long long split_end(long long lo, long long kps, long long view_end,
                                      MutantSite site) {
  const long long hi = lo + kps < view_end ? lo + kps : view_end;
  if (KVLAYER_DEVICE_MUTANT(split_drops_last_key) && hi > lo) {
    KVLAYER_MUTANT_REACHED(site);
    return hi - 1;  // planted bug
  }
  return hi;
}

/// End of the keys a verified query at logical position `pos` attends: itself and the rows
/// before it (SPEC §11, causal among the new rows). `site` names the kernel (mutant reach).
__device__ __forceinline__ long long verify_row_end(long long pos, long long len, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(verify_causal_off_by_one) && pos + 1 < len) {
    KVLAYER_MUTANT_REACHED(site);
    return pos + 2;  // planted bug: sees the next draft
  }
  return pos + 1;
}

/// Start of the keys a verified query at `pos` attends on a windowed layer (SPEC §11: its own
/// window); `last` is the launch's last query position.
__device__ __forceinline__ long long verify_row_begin(long long pos, long long last,
                                                      long long window, MutantSite site) {
  if (KVLAYER_DEVICE_MUTANT(verify_one_window) && pos != last) {
    KVLAYER_MUTANT_REACHED(site);
    pos = last;  // planted bug: one window for every row
  }
  return pos + 1 - window > 0 ? pos + 1 - window : 0;
}

}  // namespace kvlayer::cuda::detail::decode_impl
