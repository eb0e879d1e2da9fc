// CUTLASS-style testbed for the split-K decode kernel: builds a cache on the reference KvLayer,
// copies its planes to the device, poisons the output and the scratch, launches the decode
// (host-len or device-counter mode) and verifies against the float64 reference within the
// declared accuracy contract (kvlayer::ref::decode_bound).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/decode.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/testing/gpu.hpp"
#include "kvlayer/testing/rng.hpp"

namespace kvlayer::testing {

using cuda::DeviceBuffer;
using cuda::detail::DecodeArgs;
using cuda::detail::DecodePlan;
using cuda::detail::DeviceStatus;

/// n rows of dim values: every 32-value block gets its own scale 2^U(lo, hi) (varied block
/// scales, so q8_0/q5_1 scales differ block to block), values uniform in ±scale.
inline std::vector<float> random_values(Rng& rng, std::int64_t n, std::int64_t dim,
                                        double lo_log2 = -3, double hi_log2 = 2) {
  std::vector<float> out(std::size_t(n * dim));
  for (std::size_t b = 0; b < out.size(); b += 32) {
    const float scale = float(std::exp2(lo_log2 + (hi_log2 - lo_log2) * rng.uniform()));
    for (std::size_t j = b; j < b + 32 && j < out.size(); ++j) out[j] = scale * rng.sym();
  }
  return out;
}

/// Appends rows to the reference layer (f32 input).
inline void append_rows(ref::KvLayer& layer, const std::vector<float>& k,
                        const std::vector<float>& v) {
  const std::int64_t n = std::int64_t(k.size()) / layer.geometry().kv_dim_k();
  layer.append(ref::RowsView{k.data(), v.data(), n, DType::f32});
}

/// Number of SMs of device 0 (the production plan input).
inline int device_sm_count() {
  int dev = 0, sms = 0;
  KVLAYER_CUDA_TRY(cudaGetDevice(&dev));
  KVLAYER_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

/// All bits set: a NaN in f32, and a pattern no kernel result can have by accident.
inline constexpr unsigned char kPoisonByte = 0xFF;

/// Device-side state of one decode: planes, counters, q, out, scratch, status.
/// NOTE: the planes are allocated once at exactly the layer's size (the kernel reads no tail
/// bytes, so a sanitizer run sees exact bounds) and re-uploaded by upload_planes().
class DecodeBed {
 public:
  DecodeBed(const Geometry& g, int gqa, const DecodePlan& plan)
      : geometry_(g),
        gqa_(gqa),
        plan_(plan),
        k_(std::size_t(g.rows() * g.k_tok_bytes())),
        v_(std::size_t(g.rows() * g.v_tok_bytes())),
        q_(std::size_t(n_q_heads()) * g.head_dim_k * sizeof(float)),
        out_(std::size_t(n_q_heads()) * g.head_dim_v * sizeof(float)),
        scratch_(plan.scratch_bytes),
        len_d_(sizeof(std::int32_t)),
        base_d_(sizeof(std::int32_t)),
        status_(sizeof(DeviceStatus)) {
    KVLAYER_CUDA_TRY(cudaMemset(k_.get(), 0, k_.bytes()));
    KVLAYER_CUDA_TRY(cudaMemset(v_.get(), 0, v_.bytes()));
    clear_status();
  }

  int n_q_heads() const { return geometry_.n_kv_heads * gqa_; }
  std::size_t out_elems() const { return std::size_t(n_q_heads()) * geometry_.head_dim_v; }
  const DecodePlan& plan() const { return plan_; }
  void set_plan(const DecodePlan& plan) {
    plan_ = plan;
    if (scratch_.bytes() < plan.scratch_bytes) scratch_ = DeviceBuffer(plan.scratch_bytes);
  }

  void upload_planes(const ref::KvLayer& layer) {
    KVLAYER_CUDA_TRY(cudaMemcpy(k_.get(), layer.k_plane().data(), layer.k_plane().size(),
                                cudaMemcpyHostToDevice));
    KVLAYER_CUDA_TRY(cudaMemcpy(v_.get(), layer.v_plane().data(), layer.v_plane().size(),
                                cudaMemcpyHostToDevice));
  }
  void upload_query(std::span<const float> q) {
    KVLAYER_CUDA_TRY(cudaMemcpy(q_.get(), q.data(), q.size_bytes(), cudaMemcpyHostToDevice));
  }
  void set_counters(std::int32_t len_d, std::int32_t base_d) {
    KVLAYER_CUDA_TRY(cudaMemcpy(len_d_.get(), &len_d, 4, cudaMemcpyHostToDevice));
    KVLAYER_CUDA_TRY(cudaMemcpy(base_d_.get(), &base_d, 4, cudaMemcpyHostToDevice));
  }
  void clear_status() { KVLAYER_CUDA_TRY(cudaMemset(status_.get(), 0, sizeof(DeviceStatus))); }
  DeviceStatus read_status() const {
    DeviceStatus s{};
    KVLAYER_CUDA_TRY(cudaMemcpy(&s, status_.get(), sizeof s, cudaMemcpyDeviceToHost));
    return s;
  }
  /// NaN-poisons the output and the whole scratch.
  void poison() {
    KVLAYER_CUDA_TRY(cudaMemset(out_.get(), kPoisonByte, out_.bytes()));
    if (scratch_.bytes() > 0)
      KVLAYER_CUDA_TRY(cudaMemset(scratch_.get(), kPoisonByte, scratch_.bytes()));
  }

  /// Host-len launch arguments for view [max(0, len − window), len) at base.
  DecodeArgs host_args(std::int64_t len, std::int64_t base, float scale) const {
    DecodeArgs a = common_args(scale);
    a.host_len = len;
    a.host_base = base;
    return a;
  }
  /// Device-counter launch arguments (reads len_d / base_d set by set_counters).
  DecodeArgs device_args(float scale, bool with_base = true) const {
    DecodeArgs a = common_args(scale);
    a.len_d = len_d_.as<std::int32_t>();
    a.base_d = with_base ? base_d_.as<std::int32_t>() : nullptr;
    return a;
  }

  /// Poisons, launches, synchronizes, returns the launch status and the output.
  cudaError_t run(const DecodeArgs& a, std::vector<float>& out) {
    poison();
    const cudaError_t err = cuda::detail::launch_decode(a, plan_, nullptr);
    KVLAYER_CUDA_TRY(cudaDeviceSynchronize());
    out = read_out();
    return err;
  }

  std::vector<float> read_out() const {
    std::vector<float> out(out_elems());
    KVLAYER_CUDA_TRY(cudaMemcpy(out.data(), out_.get(), out_.bytes(), cudaMemcpyDeviceToHost));
    return out;
  }

  float* out_ptr() const { return out_.as<float>(); }
  std::int32_t* len_d_ptr() const { return len_d_.as<std::int32_t>(); }

 private:
  DecodeArgs common_args(float scale) const {
    DecodeArgs a;
    a.k_plane = k_.as<std::uint8_t>();
    a.v_plane = v_.as<std::uint8_t>();
    a.rows = geometry_.rows();
    a.max_ctx = geometry_.max_ctx;
    a.window = geometry_.window.value_or(0);
    a.q = q_.as<float>();
    a.out = out_.as<float>();
    a.scale = scale;
    a.scratch = scratch_.get();
    a.status = status_.as<DeviceStatus>();
    return a;
  }

  Geometry geometry_;
  int gqa_;
  DecodePlan plan_;
  DeviceBuffer k_, v_, q_, out_, scratch_, len_d_, base_d_, status_;
};

/// True when every byte of out is the poison pattern (the kernel wrote nothing).
inline bool untouched(const std::vector<float>& out) {
  for (float x : out)
    if (std::bit_cast<std::uint32_t>(x) != 0xFFFFFFFFu) return false;
  return true;
}

/// Verifies a GPU output against the float64 reference decode of `view` of `layer` within
/// the per-element bound of the declared precision (SPEC §8). Where the reference is NaN (a
/// canonical bad block was attended) the GPU must be NaN; elsewhere finite and within bound.
/// Returns the largest |err| / bound seen (for the log).
inline double expect_within_contract(const std::vector<float>& gpu, const std::vector<double>& want,
                                     const ref::KvLayer& layer, std::span<const float> q,
                                     int n_q_heads, float scale, const ref::DecodeView& view,
                                     const DecodePlan& plan, const std::string& what,
                                     bool expect_nonzero = true) {
  EXPECT_EQ(gpu.size(), want.size()) << what;
  if (gpu.size() != want.size()) return 0;
  const ref::DecodeBound b =
      ref::decode_bound(layer, q, n_q_heads, scale, view, cuda::detail::accumulation_shape(plan));
  const std::vector<double>& bound = b.bound;
  double worst = 0, norm = 0;
  int failures = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const int head = int(i / std::size_t(layer.geometry().head_dim_v));
    const int e = int(i % std::size_t(layer.geometry().head_dim_v));
    if (std::isnan(want[i])) {
      if (!std::isnan(gpu[i]) && failures++ < 8)
        ADD_FAILURE() << what << ": head " << head << " elem " << e
                      << ": reference is NaN (bad block attended), GPU gave " << gpu[i];
      bound_tightness().skip();
      continue;
    }
    norm += double(gpu[i]) * gpu[i];
    const double err = std::fabs(double(gpu[i]) - want[i]);
    if (!std::isfinite(gpu[i]) || !(err <= bound[i])) {
      if (failures++ < 8)
        ADD_FAILURE() << what << ": head " << head << " elem " << e << ": GPU " << gpu[i]
                      << " reference " << want[i] << " |err| " << err << " > bound " << bound[i];
      continue;
    }
    if (bound[i] > 0) worst = std::max(worst, err / bound[i]);
    bound_tightness().record(gpu[i], b, i);
    systematic_check().record(gpu[i], want[i], b, i);
  }
  systematic_check().end_launch();
  if (failures > 8) ADD_FAILURE() << what << ": " << failures << " elements out of contract";
  if (expect_nonzero) {
    EXPECT_GT(norm, 0.0) << what << ": output is all zero (vacuous)";
  }
  return worst;
}

}  // namespace kvlayer::testing
