// A host emulation of one CUDA warp (32 std::threads meeting at a barrier for every collective),
// providing the `ops` layer of cuda/src/quantize_warp.cuh, so that the device block quantizers
// themselves (not a re-implementation) run on the host against the reference. Include this
// before quantize_warp.cuh.
//
// NOTE: it checks the warp algorithms (reductions, first-lane selections, ballots, nibble
// packing, branch structure) and the rounding sequence; it cannot check the CUDA intrinsics'
// own semantics (IEEE __fdiv_rn/__frcp_rn, roundf, fminf of ±0), which the GPU tests do.
#pragma once

#define KVLAYER_WARP_EMULATION 1

#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "kvlayer/half.hpp"

namespace kvlayer::cuda::detail::ops {

struct Warp {
  std::barrier<> meet{32};
  float f[32] = {};
  unsigned u[32] = {};
};
inline thread_local Warp* tl_warp = nullptr;
inline thread_local int tl_lane = 0;

inline unsigned ballot(bool p) {
  Warp& w = *tl_warp;
  w.u[tl_lane] = p ? 1u : 0u;
  w.meet.arrive_and_wait();
  unsigned m = 0;
  for (int i = 0; i < 32; ++i) m |= (w.u[i] != 0 ? 1u : 0u) << i;
  w.meet.arrive_and_wait();
  return m;
}
inline float exchange(float x, int src) {
  Warp& w = *tl_warp;
  w.f[tl_lane] = x;
  w.meet.arrive_and_wait();
  const float r = w.f[src];
  w.meet.arrive_and_wait();
  return r;
}
inline float shfl(float x, int src_lane) {
  return exchange(x, src_lane);
}
inline float shfl_xor(float x, int mask) {
  return exchange(x, tl_lane ^ mask);
}
inline unsigned shfl_down(unsigned x, int delta) {
  Warp& w = *tl_warp;
  w.u[tl_lane] = x;
  w.meet.arrive_and_wait();
  const unsigned r = tl_lane + delta < 32 ? w.u[tl_lane + delta] : x;
  w.meet.arrive_and_wait();
  return r;
}
inline int lowest_lane(unsigned mask) {
  return std::countr_zero(mask);
}
inline unsigned bits(float x) {
  return std::bit_cast<unsigned>(x);
}
// Host IEEE single arithmetic (SSE; the test target is built with -ffp-contract=off).
inline float div_rn(float a, float b) {
  return a / b;
}
inline float rcp_rn(float a) {
  return 1.0f / a;
}
inline float sub_rn(float a, float b) {
  return a - b;
}
inline float mul_rn(float a, float b) {
  return a * b;
}
inline float add_rn(float a, float b) {
  return a + b;
}
inline float round_half_away(float x) {
  return std::roundf(x);
}
inline float fmax(float a, float b) {
  return std::fmax(a, b);
}
inline float fmin(float a, float b) {
  return std::fmin(a, b);
}
inline float fabs(float x) {
  return std::fabs(x);
}
inline unsigned short half_bits(float x) {
  return kvlayer::f32_to_f16_bits(x);
}
inline void store_u16(std::uint8_t* p, unsigned short v) {
  std::memcpy(p, &v, 2);
}
inline void store_u32(std::uint8_t* p, unsigned v) {
  std::memcpy(p, &v, 4);
}

/// Runs body(lane) on 32 threads forming one warp; returns when all have finished.
inline void run_warp(const std::function<void(int)>& body) {
  Warp w;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane)
    lanes.emplace_back([&w, &body, lane] {
      tl_warp = &w;
      tl_lane = lane;
      body(lane);
    });
  for (auto& t : lanes) t.join();
}

}  // namespace kvlayer::cuda::detail::ops
