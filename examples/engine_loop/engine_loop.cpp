// The smallest engine loop on kvlayer: one attention layer's KV cache on the GPU, filled by a
// prefill, then advanced one token per replay of a CUDA graph that holds one decode step
// (append the token's K/V row, advance the device length, attend). Checked at the end against
// the CPU reference within its declared accuracy bound.
//
// Usage: engine_loop [STEPS]   (default 64). Exit status: 0 passed, 1 failed, 2 bad usage,
// 77 no CUDA device (nothing to run: a CI machine without a GPU).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace {

using kvlayer::DType;
namespace kvc = kvlayer::cuda;

std::vector<float> random_values(std::int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = uniform(rng);
  return v;
}

kvc::DeviceBuffer upload(const std::vector<float>& host) {
  kvc::DeviceBuffer dev(host.size() * sizeof(float));
  KVLAYER_CUDA_TRY(cudaMemcpy(dev.get(), host.data(), dev.bytes(), cudaMemcpyHostToDevice));
  return dev;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "engine_loop: FAILED: %s\n", why.c_str());
  return 1;
}

int run(std::int64_t steps) {
  // One layer: 8 KV heads of 128 (K and V), 32 query heads (GQA 4), room for 4096 tokens.
  kvlayer::Geometry g;
  g.n_kv_heads = 8;
  g.head_dim_k = g.head_dim_v = 128;
  g.max_ctx = 4096;
  const int n_q_heads = 32;
  const std::int64_t prefill = 300;

  kvc::Stream stream;  // declared first: it must outlive the layer
  kvc::KvLayer layer(g, n_q_heads, stream.get());
  kvlayer::ref::KvLayer ref(g);  // the CPU reference, fed the same rows
  std::printf("layer: %s, %d query heads, decode over %d splits\n", g.describe().c_str(),
              n_q_heads, layer.decode_plan().n_splits);

  // Prefill: the prompt's K/V rows, in device memory as the model leaves them.
  std::mt19937 rng(20261129);
  const auto prompt_k = random_values(prefill * g.kv_dim_k(), rng);
  const auto prompt_v = random_values(prefill * g.kv_dim_v(), rng);
  const kvc::DeviceBuffer prompt_k_d = upload(prompt_k), prompt_v_d = upload(prompt_v);
  layer.append({prompt_k_d.get(), prompt_v_d.get(), prefill, DType::f32});
  ref.append({prompt_k.data(), prompt_v.data(), prefill, DType::f32});

  // Decode: every step reads the new token's K/V row and its query from fixed device slots,
  // so that one captured graph serves every token.
  const auto tokens_k = random_values(steps * g.kv_dim_k(), rng);
  const auto tokens_v = random_values(steps * g.kv_dim_v(), rng);
  const auto q = random_values(n_q_heads * g.head_dim_k, rng);
  const kvc::DeviceBuffer tokens_k_d = upload(tokens_k), tokens_v_d = upload(tokens_v);
  const kvc::DeviceBuffer q_d = upload(q);
  const kvc::DeviceBuffer row_k(g.kv_dim_k() * sizeof(float)), row_v(g.kv_dim_v() * sizeof(float));
  const kvc::DeviceBuffer out_d(n_q_heads * g.head_dim_v * sizeof(float));

  layer.reserve(steps);  // room for the whole chain (a no-op on this flat layer; rings need it)
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(layer.stream()));
  KVLAYER_CUDA_TRY(cudaStreamBeginCapture(layer.stream(), cudaStreamCaptureModeThreadLocal));
  layer.append_dc({row_k.get(), row_v.get(), 1, DType::f32});
  layer.inc_seqlen();
  layer.decode_dc(q_d.as<float>(), out_d.as<float>());
  const kvc::Graph step = kvc::Graph::end_capture(layer.stream());

  for (std::int64_t t = 0; t < steps; ++t) {
    // The model's K/V for token t go into the step's slots; then the captured step runs.
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(row_k.get(), tokens_k_d.as<float>() + t * g.kv_dim_k(),
                                     row_k.bytes(), cudaMemcpyDeviceToDevice, layer.stream()));
    KVLAYER_CUDA_TRY(cudaMemcpyAsync(row_v.get(), tokens_v_d.as<float>() + t * g.kv_dim_v(),
                                     row_v.bytes(), cudaMemcpyDeviceToDevice, layer.stream()));
    step.launch(layer.stream());
  }
  layer.account_steps(steps);  // the host learns the length the device counted
  std::printf("decode: %lld steps replayed from one graph of %zu nodes\n",
              static_cast<long long>(steps), step.node_count());

  const kvlayer::LayerStatus status = layer.status();  // synchronizes the stream
  if (!status.ok()) return fail("layer status: " + status.message());
  if (layer.len() != prefill + steps || layer.read_len_d() != layer.len())
    return fail("length " + std::to_string(layer.len()) + " (device " +
                std::to_string(layer.read_len_d()) + "), expected " +
                std::to_string(prefill + steps));
  std::vector<float> out(static_cast<std::size_t>(n_q_heads * g.head_dim_v));
  KVLAYER_CUDA_TRY(cudaMemcpy(out.data(), out_d.get(), out_d.bytes(), cudaMemcpyDeviceToHost));

  // The last step's attention output against the reference over the same tokens.
  ref.append({tokens_k.data(), tokens_v.data(), steps, DType::f32});
  const std::vector<double> want = ref.decode(q, n_q_heads);
  const kvlayer::ref::DecodeBound bound = kvlayer::ref::decode_bound(
      ref, q, n_q_heads, std::nullopt, {0, ref.len(), 0}, layer.accumulation_shape());
  double worst = 0;  // largest |GPU − reference| / bound
  for (std::size_t e = 0; e < out.size(); ++e) {
    if (!std::isfinite(out[e])) return fail("output " + std::to_string(e) + " is not finite");
    const double err = std::abs(double(out[e]) - want[e]);
    if (err > bound.bound[e])
      return fail("output " + std::to_string(e) + ": " + std::to_string(out[e]) + " vs reference " +
                  std::to_string(want[e]) + ", beyond the bound " + std::to_string(bound.bound[e]));
    if (bound.bound[e] > 0) worst = std::max(worst, err / bound.bound[e]);
  }
  std::printf("layer: len %lld, status %s; %zu outputs finite, within the reference's bound "
              "(worst error %.3f of it)\n",
              static_cast<long long>(layer.len()), status.message().c_str(), out.size(), worst);
  std::printf("engine_loop: PASS\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 64;
  if (argc == 2) {
    char* end = nullptr;
    steps = std::strtoll(argv[1], &end, 10);
    if (*end != '\0') steps = 0;
  }
  if (argc > 2 || steps < 1 || steps > 3000) {
    std::fprintf(stderr, "usage: engine_loop [STEPS]  (1..3000, default 64)\n");
    return 2;
  }
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("engine_loop: no CUDA device (%s): skipped\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    return 77;
  }
  try {
    return run(steps);
  } catch (const std::exception& e) {  // kvlayer::Error: a refusal or a CUDA failure
    return fail(e.what());
  }
}
