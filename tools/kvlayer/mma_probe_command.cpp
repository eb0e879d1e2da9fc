// kvlayer mma-probe: does the GPU's tensor-core step keep accuracy.hpp's rounding point (5)?
// Runs mma.sync m16n8k16 (the decode's instruction) and wgmma m64n8k16 (the one a
// warp-specialized verify would use) on tiles of exact, random, cancelling and one-large-term
// data, and reports each engine's largest error against the exact result in units of
// 2^-24·Σ|addends| (the declared bound is 36), and how many results each alignment-truncation
// model (p bits kept, mma_model.hpp) reproduces bit for bit.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "commands.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"
#include "mma_model.hpp"
#include "mma_probe.hpp"
#include "wgmma_operand_probe.hpp"

namespace kvlayer::cli {
namespace {

using cuda::DeviceBuffer;
using cuda::Stream;

constexpr std::string_view kUsage =
    "usage: kvlayer mma-probe [--tiles N] [--seed S]\n"
    "  One tensor-core step D = A*B + C (fp16 x fp16 -> f32, k = 16) on N tiles of 64 x 8\n"
    "  results (small integers, random exponents, cancellation, one large product), by\n"
    "  mma.sync m16n8k16 and (sm_90a builds) wgmma m64n8k16, against the exact result: the\n"
    "  largest error in units of 2^-24 * sum|addends| per engine and data kind (accuracy.hpp\n"
    "  (5) declares at most 36), and per alignment-truncation model (products exact, addends\n"
    "  truncated to p bits below the largest, the sum truncated to f32) how many results it\n"
    "  reproduces exactly. The integer tiles must come back exact (else the probe's operand\n"
    "  layout is wrong and it stops with an error).\n"
    "  On sm_90a builds also the wgmma verify's operands (decode_wgmma_verify.cu's layout,\n"
    "  descriptors and instructions) on small integers: S = Q*K^T and O = P*V must be exact.\n"
    "  --tiles N  tiles (default 1024, a multiple of 4)\n"
    "  --seed S   the tiles' seed (default 1)\n";

constexpr int kModelBits[] = {24, 25, 26, 27, 28, 40};
constexpr const char* kKindNames[kMmaTileKinds] = {"integers", "random", "cancelling", "one large"};

struct EngineResult {
  double worst[kMmaTileKinds] = {};
  long long model_matches[std::size(kModelBits)] = {};
  long long results = 0;
  bool exact_ok = true;
};

EngineResult evaluate(const std::vector<MmaTile>& tiles, const std::vector<float>& d) {
  EngineResult r;
  for (std::size_t ti = 0; ti < tiles.size(); ++ti)
    for (int i = 0; i < MmaTile::kM; ++i)
      for (int j = 0; j < MmaTile::kN; ++j) {
        const float got = d[(ti * MmaTile::kM + std::size_t(i)) * MmaTile::kN + std::size_t(j)];
        const int kind = int(ti % kMmaTileKinds);
        const double ratio = error_ratio(tiles[ti], i, j, got);
        r.worst[kind] = std::max(r.worst[kind], ratio);
        if (kind == 0 && ratio != 0) r.exact_ok = false;
        for (std::size_t m = 0; m < std::size(kModelBits); ++m)
          r.model_matches[m] += truncation_model(tiles[ti], i, j, kModelBits[m]) == got;
        ++r.results;
      }
  return r;
}

/// The wgmma verify's operands (wgmma_operand_probe.hpp) on integers in [-4, 4]: the S and O
/// elements that differ from the exact products (2 · 64 · 64 · 2 of each result at most, so f32
/// holds them exactly).
struct OperandResult {
  long long s_wrong = 0, o_wrong = 0;
};

OperandResult run_operand_probe(cudaStream_t stream, std::uint64_t seed, bool swap) {
  using In = WgmmaOperandInputs;
  auto in = std::make_unique<In>();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<int> q(In::kRows * In::kDims), p(In::kRows * In::kKeys), k(In::kKeys * In::kDims);
  for (int& x : q) x = small(rng);
  for (int& x : p) x = small(rng);
  for (int& x : k) x = small(rng);
  for (int r = 0; r < In::kRows; ++r)
    for (int d = 0; d < In::kDims; ++d) in->q[r][d] = f32_to_f16_bits(float(q[r * In::kDims + d]));
  for (int r = 0; r < In::kRows; ++r)
    for (int j = 0; j < In::kKeys; ++j) in->p[r][j] = f32_to_f16_bits(float(p[r * In::kKeys + j]));
  for (int j = 0; j < In::kKeys; ++j)
    for (int d = 0; d < In::kDims; ++d) in->k[j][d] = f32_to_f16_bits(float(k[j * In::kDims + d]));
  DeviceBuffer in_d(sizeof(In)), s_d(std::size_t(In::kRows) * In::kKeys * 4),
      o_d(std::size_t(In::kRows) * In::kDims * 4);
  KVLAYER_CUDA_TRY(
      cudaMemcpyAsync(in_d.get(), in.get(), sizeof(In), cudaMemcpyHostToDevice, stream));
  // Poisoned first: an element the kernel did not write reads as NaN.
  KVLAYER_CUDA_TRY(cudaMemsetAsync(s_d.get(), 0xFF, s_d.bytes(), stream));
  KVLAYER_CUDA_TRY(cudaMemsetAsync(o_d.get(), 0xFF, o_d.bytes(), stream));
  KVLAYER_CUDA_TRY(
      launch_wgmma_operand_probe(in_d.as<In>(), s_d.as<float>(), o_d.as<float>(), swap, stream));
  std::vector<float> s(std::size_t(In::kRows) * In::kKeys), o(std::size_t(In::kRows) * In::kDims);
  KVLAYER_CUDA_TRY(
      cudaMemcpyAsync(s.data(), s_d.get(), s_d.bytes(), cudaMemcpyDeviceToHost, stream));
  KVLAYER_CUDA_TRY(
      cudaMemcpyAsync(o.data(), o_d.get(), o_d.bytes(), cudaMemcpyDeviceToHost, stream));
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream));
  OperandResult r;
  for (int i = 0; i < In::kRows; ++i)
    for (int j = 0; j < In::kKeys; ++j) {
      int exact = 0;
      for (int d = 0; d < In::kDims; ++d) exact += q[i * In::kDims + d] * k[j * In::kDims + d];
      r.s_wrong += s[std::size_t(i) * In::kKeys + j] != float(exact);
    }
  for (int i = 0; i < In::kRows; ++i)
    for (int d = 0; d < In::kDims; ++d) {
      int exact = 0;
      for (int j = 0; j < In::kKeys; ++j) exact += p[i * In::kKeys + j] * k[j * In::kDims + d];
      r.o_wrong += o[std::size_t(i) * In::kDims + d] != float(exact);
    }
  return r;
}

int run_mma_probe(const std::vector<std::string>& args) {
  const Options o(args, {"tiles", "seed"}, {});
  const int n = int(o.integer("tiles", 1024, 4, 1 << 16));
  if (n % kMmaTileKinds != 0)
    throw UsageError("--tiles " + std::to_string(n) + " must be a multiple of " +
                     std::to_string(kMmaTileKinds));
  const auto seed = std::uint64_t(o.integer("seed", 1, 0, (std::int64_t(1) << 62)));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw Error(ErrorKind::device, "no CUDA device found (run it on the GPU machine)");
  cudaDeviceProp p{};
  KVLAYER_CUDA_TRY(cudaGetDeviceProperties(&p, 0));
  Stream stream;
  const std::vector<MmaTile> tiles = make_mma_tiles(n, seed);
  DeviceBuffer tiles_d(tiles.size() * sizeof(MmaTile)), d_d(std::size_t(n) * 64 * 8 * 4),
      flag(sizeof(int));
  KVLAYER_CUDA_TRY(cudaMemcpyAsync(tiles_d.get(), tiles.data(), tiles_d.bytes(),
                                   cudaMemcpyHostToDevice, stream.get()));
  int wgmma_built = 0;
  KVLAYER_CUDA_TRY(launch_wgmma_built(flag.as<int>(), stream.get()));
  KVLAYER_CUDA_TRY(
      cudaMemcpyAsync(&wgmma_built, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, stream.get()));
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  std::printf("kvlayer mma-probe on %s (sm_%d%d), %d tiles of 64 x 8 results, seed %llu\n", p.name,
              p.major, p.minor, n, static_cast<unsigned long long>(seed));

  std::vector<float> d(std::size_t(n) * 64 * 8);
  const auto run = [&](MmaEngine engine, int lbo, int sbo) {
    // Poisoned first: a result the kernel did not write reads as NaN (an infinite error).
    KVLAYER_CUDA_TRY(cudaMemsetAsync(d_d.get(), 0xFF, d_d.bytes(), stream.get()));
    KVLAYER_CUDA_TRY(launch_mma_probe(engine, tiles_d.as<MmaTile>(), n, d_d.as<float>(), lbo, sbo,
                                      stream.get()));
    KVLAYER_CUDA_TRY(
        cudaMemcpyAsync(d.data(), d_d.get(), d_d.bytes(), cudaMemcpyDeviceToHost, stream.get()));
    KVLAYER_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return evaluate(tiles, d);
  };
  std::printf("\n%-26s", "engine");
  for (const char* k : kKindNames) std::printf(" %12s", k);
  for (const int b : kModelBits) std::printf("   p=%-3d", b);
  std::printf("\n");
  const auto report = [&](const char* name, const EngineResult& r) {
    std::printf("%-26s", name);
    for (const double w : r.worst) std::printf(" %12.3g", w);
    for (const long long m : r.model_matches)
      std::printf(" %7.4f", double(m) / double(std::max<long long>(r.results, 1)));
    std::printf("\n");
  };
  int status = kExitOk;
  const EngineResult sync = run(MmaEngine::mma_sync, 0, 0);
  report("mma.sync m16n8k16", sync);
  if (!sync.exact_ok) {
    std::printf("mma.sync: the integer tiles did not come back exact: operand layout wrong\n");
    status = kExitFailure;
  }
  if (wgmma_built == 0) {
    std::printf("wgmma: not in this build (compiled without sm_90a)\n");
  } else {
    // The two readings of the no-swizzle descriptor's offsets for B's two core matrices along
    // K (128 bytes apart): the leading offset, or the stride offset.
    bool any = false;
    for (const auto& [lbo, sbo, name] : {std::tuple{128, 256, "wgmma m64n8k16 (LBO 128)"},
                                         std::tuple{256, 128, "wgmma m64n8k16 (SBO 128)"}}) {
      const EngineResult w = run(MmaEngine::wgmma, lbo, sbo);
      if (!w.exact_ok) {
        std::printf("%-26s integer tiles not exact: not this descriptor reading\n", name);
        continue;
      }
      report(name, w);
      any = true;
    }
    if (!any) {
      std::printf("wgmma: neither descriptor reading returned the integer tiles exactly\n");
      status = kExitFailure;
    }
    // The verify kernel's own operands; on a failure, PV's other offset reading says whether
    // the MN-major descriptor is the cause.
    const OperandResult v = run_operand_probe(stream.get(), seed, false);
    std::printf(
        "\nwgmma verify operands (128-byte swizzle): S = Q*K^T %lld of %d wrong, "
        "O = P*V %lld of %d wrong: %s\n",
        v.s_wrong, WgmmaOperandInputs::kRows * WgmmaOperandInputs::kKeys, v.o_wrong,
        WgmmaOperandInputs::kRows * WgmmaOperandInputs::kDims,
        v.s_wrong + v.o_wrong == 0 ? "exact" : "WRONG");
    if (v.s_wrong + v.o_wrong != 0) {
      status = kExitFailure;
      const OperandResult x = run_operand_probe(stream.get(), seed, true);
      std::printf("  with PV's leading and stride offsets swapped: O %lld wrong\n", x.o_wrong);
    }
  }
  std::printf(
      "\ncolumns: largest |D - exact| / (2^-24 sum|addends|) per data kind (declared "
      "bound: %g); p=N: share of results the N-bit alignment-truncation model reproduces "
      "exactly\n",
      kMmaDeclaredRatio);
  return status;
}

}  // namespace

const Command& mma_probe_command() {
  static const Command c{"mma-probe",
                         "GPU: tensor-core rounding (mma.sync, wgmma) against accuracy.hpp (5)",
                         kUsage, &run_mma_probe};
  return c;
}

}  // namespace kvlayer::cli
