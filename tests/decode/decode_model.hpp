// A host model of the split-K decode's arithmetic: the same partition, tiles and rounding
// points as cuda/src/decode/decode_cuda_core.cu (fp16 q, per-block f32 dots, the kernel's butterfly
// orders, per-tile online softmax, fp16 p, f32 PV, f32 merge). It runs without a GPU, so the
// declared precision can be checked against the accuracy contract on every machine.
// NOTE: not bit-exact with the GPU (host exp2f differs from CUDA's by an ulp or two; nvcc may
// contract l·α + Σp into an FMA), only the same rounding points; the GPU tests compare the GPU.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "decode/decode.hpp"
#include "decode/partition.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::testing {

/// Lane 0's result of an xor butterfly over x (size a power of two): the kernel's order.
inline float butterfly_sum(std::vector<float> x) {
  for (std::size_t off = x.size() / 2; off > 0; off /= 2) {
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] + x[i ^ off];
    x.swap(y);
  }
  return x[0];
}

inline float model_round_f16(float x) {
  return f16_bits_to_f32(f32_to_f16_bits(x));
}

/// The kernel's output for `view` of `layer` under `plan` (host mode semantics).
inline std::vector<float> model_decode(const ref::KvLayer& layer, std::span<const float> q, int gqa,
                                       float scale, const ref::DecodeView& view,
                                       const cuda::detail::DecodePlan& plan) {
  const Geometry& g = layer.geometry();
  const int D = g.head_dim_k, NB = D / 32, T = plan.tile_keys, S = plan.n_splits;
  const float sentinel = -FLT_MAX, log2e = 1.4426950408889634f;
  std::vector<float> out(std::size_t(g.n_kv_heads) * gqa * D, 0.0f);
  const std::int64_t n = view.end - view.begin;
  if (n <= 0) return out;
  const std::int64_t kps = cuda::detail::decode_keys_per_split(n, S, T, plan.split_balance);
  const std::int64_t active = (n + kps - 1) / kps;
  const auto& kp = layer.k_plane();

  for (int kv = 0; kv < g.n_kv_heads; ++kv) {
    // V of the view for this head, dequantized exactly (SPEC §4) by the reference.
    std::vector<std::vector<float>> vrows(static_cast<std::size_t>(n));
    for (std::int64_t t = 0; t < n; ++t) {
      const auto row = layer.dequantized_row(Plane::v, view.begin + t - view.base);
      vrows[std::size_t(t)].assign(row.begin() + kv * D, row.begin() + (kv + 1) * D);
    }
    for (int h = 0; h < gqa; ++h) {
      std::vector<float> qt(static_cast<std::size_t>(D));
      for (int d = 0; d < D; ++d)
        qt[std::size_t(d)] = model_round_f16(q[std::size_t((kv * gqa + h) * D + d)]);
      std::vector<float> pm(static_cast<std::size_t>(active)), pl(static_cast<std::size_t>(active));
      std::vector<std::vector<float>> po(static_cast<std::size_t>(active),
                                         std::vector<float>(static_cast<std::size_t>(D)));
      for (std::int64_t i = 0; i < active; ++i) {
        const std::int64_t lo = view.begin + i * kps, hi = std::min(view.end, lo + kps);
        float m = sentinel, l = 0;
        std::vector<float> acc(static_cast<std::size_t>(D), 0.0f);
        for (std::int64_t key0 = lo; key0 < hi; key0 += T) {
          const int valid = int(std::min<std::int64_t>(T, hi - key0));
          std::vector<float> s(static_cast<std::size_t>(valid));
          for (int t = 0; t < valid; ++t) {
            const std::uint8_t* row = kp.data() + (key0 + t - view.base) * g.k_tok_bytes();
            std::vector<float> part(static_cast<std::size_t>(NB));
            for (int b = 0; b < NB; ++b) {
              const std::uint8_t* blk = row + (kv * NB + b) * 34;
              const float d = f16_bits_to_f32(std::uint16_t(blk[0] | blk[1] << 8));
              float a = 0;
              for (int j = 0; j < 32; ++j)
                a = std::fmaf(qt[std::size_t(b * 32 + j)], float(std::int8_t(blk[2 + j])), a);
              part[std::size_t(b)] = a * d;
            }
            s[std::size_t(t)] = butterfly_sum(part) * scale;
          }
          float top = sentinel;
          for (float x : s) top = std::fmax(top, x);
          const float m_new = std::fmax(m, top);
          const float alpha = m_new == m ? 1.0f : std::exp2(float((m - m_new) * log2e));
          std::vector<float> lanes(32, 0.0f), p(static_cast<std::size_t>(valid));
          for (int t = 0; t < valid; ++t) {
            const float pt = std::exp2(float((s[std::size_t(t)] - m_new) * log2e));
            lanes[std::size_t(t % 32)] += pt;
            p[std::size_t(t)] = model_round_f16(pt);
          }
          l = std::fmaf(l, alpha, butterfly_sum(lanes));
          m = m_new;
          for (int d = 0; d < D; ++d) {
            acc[std::size_t(d)] *= alpha;
            for (int t = 0; t < valid; ++t)
              acc[std::size_t(d)] = std::fmaf(
                  p[std::size_t(t)], vrows[std::size_t(key0 - view.begin + t)][std::size_t(d)],
                  acc[std::size_t(d)]);
          }
        }
        pm[std::size_t(i)] = m;
        pl[std::size_t(i)] = l;
        po[std::size_t(i)] = acc;
      }
      float top = sentinel;
      for (float x : pm) top = std::fmax(top, x);
      for (int d = 0; d < D; ++d) {
        float num = 0, den = 0;
        for (std::int64_t i = 0; i < active; ++i) {
          const float mi = pm[std::size_t(i)];
          const float w = mi == top ? 1.0f : std::exp2(float((mi - top) * log2e));
          num = std::fmaf(po[std::size_t(i)][std::size_t(d)], w, num);
          den = std::fmaf(pl[std::size_t(i)], w, den);
        }
        out[std::size_t((kv * gqa + h) * D + d)] = num / den;
      }
    }
  }
  return out;
}

}  // namespace kvlayer::testing
