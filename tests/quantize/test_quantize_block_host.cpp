// The device block quantizers (cuda/src/quantize_block.cuh), run on the host with host f32 ops,
// against ref::quantize_q8_0_block / quantize_q5_1_block: every byte and every bad-block value,
// on random and adversarial blocks (no GPU needed).
#include "quantize_host_ops.hpp"
// quantize_host_ops.hpp first: it provides the ops layer.
#include <bit>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kvlayer/reference/quantize.hpp"
#include "cuda_testbed.hpp"
#include "quantize_block.cuh"

namespace kvlayer::testing {
namespace {

namespace d = cuda::detail;

/// Blocks of every adversarial pattern (several draws each) and random scales, as f32 and as
/// f16/bf16 round trips (what the kernel sees after converting those inputs).
std::vector<float> test_blocks() {
  Rng rng(0x0A5E);
  std::vector<float> x;
  auto add_block = [&](const float* b) { x.insert(x.end(), b, b + 32); };
  float blk[32];
  for (int p = 0; p < kPatterns; ++p) {
    for (int draw = 0; draw < 40; ++draw) {
      adversarial_block(p, rng, blk);
      add_block(blk);
      float h[32], b[32];
      for (int j = 0; j < 32; ++j) {
        h[j] = f16_bits_to_f32(f32_to_f16_bits(blk[j]));
        b[j] = bf16_bits_to_f32(f32_to_bf16_bits(blk[j]));
      }
      add_block(h);
      add_block(b);
    }
  }
  // Out of fp16's range with two values of equal largest magnitude: the FIRST is reported.
  for (int j = 0; j < 32; ++j) blk[j] = 1.0f;
  blk[3] = -1.0e7f;
  blk[7] = 1.0e7f;
  add_block(blk);
  std::vector<float> r(32 * 600);
  fill_values(r, Fill::random, rng);
  x.insert(x.end(), r.begin(), r.end());
  fill_values(r, Fill::adversarial, rng);
  x.insert(x.end(), r.begin(), r.end());
  return x;
}

struct Result {
  std::vector<std::uint8_t> bytes;
  std::vector<char> bad;
  std::vector<float> value;
};

template <int Bytes, typename Quantize>
Result run_on_host(const std::vector<float>& x, Quantize quantize) {
  const std::size_t blocks = x.size() / 32;
  Result r{std::vector<std::uint8_t>(blocks * Bytes, 0xCD), std::vector<char>(blocks, 0),
           std::vector<float>(blocks, 0.0f)};
  for (std::size_t b = 0; b < blocks; ++b) {
    float block[32];
    std::memcpy(block, x.data() + 32 * b, sizeof block);
    float v = 0;
    r.bad[b] = quantize(block, r.bytes.data() + Bytes * b, &v);
    r.value[b] = v;
  }
  return r;
}

template <int Bytes, typename Ref>
void compare(const std::vector<float>& x, const Result& got, Ref ref, const char* name) {
  const std::size_t blocks = x.size() / 32;
  int failures = 0;
  for (std::size_t b = 0; b < blocks && failures < 10; ++b) {
    std::uint8_t want[Bytes];
    const std::optional<float> bad = ref(std::span<const float, 32>(x.data() + 32 * b, 32),
                                         std::span<std::uint8_t, Bytes>(want));
    std::string why;
    if (std::memcmp(want, got.bytes.data() + Bytes * b, Bytes) != 0) why += " bytes differ;";
    if (bad.has_value() != bool(got.bad[b])) why += " bad flag differs;";
    if (bad && std::bit_cast<std::uint32_t>(*bad) != std::bit_cast<std::uint32_t>(got.value[b]))
      why += " bad value " + std::to_string(got.value[b]) + " vs " + std::to_string(*bad) + ";";
    if (!why.empty()) {
      ++failures;
      std::string xs;
      for (int j = 0; j < 32; ++j) xs += std::to_string(x[32 * b + std::size_t(j)]) + " ";
      ADD_FAILURE() << name << " block " << b << ":" << why << " x = " << xs;
    }
  }
}

TEST(QuantizeBlockHost, Q8_0EqualsReference) {
  const std::vector<float> x = test_blocks();
  const Result got = run_on_host<kQ8_0BlockBytes>(x, d::quantize_q8_0_block);
  compare<kQ8_0BlockBytes>(x, got, ref::quantize_q8_0_block, "q8_0");
}

TEST(QuantizeBlockHost, Q5_1EqualsReference) {
  const std::vector<float> x = test_blocks();
  const Result got = run_on_host<kQ5_1BlockBytes>(x, d::quantize_q5_1_block);
  compare<kQ5_1BlockBytes>(x, got, ref::quantize_q5_1_block, "q5_1");
}

}  // namespace
}  // namespace kvlayer::testing
