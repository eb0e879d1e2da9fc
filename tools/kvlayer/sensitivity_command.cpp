// kvlayer sensitivity: how small a systematic error the decode check would catch, per view
// length, head dim and data kind, on the reference (issue #34's sweep; the GPU version plants
// the same errors in the kernels). For each configuration it builds a one-KV-head layer (gqa
// 8), computes the float64 decode o and its bound (ref::decode_bound, a nominal tensor-core
// accumulation shape), then plants each error of relative size 2^-k in a float64 attention of
// fp16(q) over the same dequantized cache (what a GPU exact but for the planted error would
// output) and reports the smallest k whose output leaves o's bound somewhere ("caught"). A real
// GPU adds its own rounding, which can move an element either way. A verify row is a decode of its
// own view with its own bound, so the table holds for verify rows as well.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "kvlayer/cuda/limits.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "kvlayer/reference/systematic_check.hpp"

#ifdef KVLAYER_WITH_CUDA
#include "sensitivity_gpu.hpp"
#endif

namespace kvlayer::cli {
namespace {

constexpr int kGqa = 8;
constexpr int kFirstExponent = 8, kLastExponent = 14;  // planted errors 2^-8 … 2^-14
constexpr std::int64_t kBuckets[] = {1024, 4096, 16384, 65536, 131072};
constexpr std::int64_t kChunk = 4096;

enum class Data { normal, peaked };
const char* data_name(Data d) {
  return d == Data::normal ? "normal" : "peaked";
}

/// The planted errors, each a closed form on the float64 attention's parts (A = Σ w·v, L = Σ w
/// with w = e^(s − max s), and the same sums over the last split: A_s, L_s).
enum class Plant { scale, split_weight, pv_split, v_dequant };
constexpr Plant kPlants[] = {Plant::scale, Plant::split_weight, Plant::pv_split, Plant::v_dequant};
const char* plant_name(Plant p) {
  switch (p) {
    case Plant::scale:
      return "softmax scale";
    case Plant::split_weight:
      return "last split's merge weight";
    case Plant::pv_split:
      return "last split's P.V";
    default:
      return "V dequantization";
  }
}

/// A nominal tensor-core plan's accumulation (the bound's shape): up to 128 splits of ≥ 64
/// keys, 16-key tiles, 64 keys per chained PV mma step per warp.
AccumulationShape nominal_shape(std::int64_t keys, std::int64_t* keys_per_split) {
  const std::int64_t splits = std::clamp<std::int64_t>((keys + 63) / 64, 1, 128);
  const std::int64_t per = ((keys + splits - 1) / splits + 15) / 16 * 16;
  *keys_per_split = per;
  AccumulationShape s;
  s.max_keys_per_split = per;
  s.n_splits = (keys + per - 1) / per;
  s.rescales = (per + 15) / 16 + 1;
  s.tensor_core = true;
  s.pv_mma_steps = (per + 63) / 64;
  return s;
}

/// One configuration's layer, queries and float64 parts.
struct Setup {
  Geometry g;
  int rows = 1;            ///< T: 1 a decode, ≥ 2 a verify of the view's last T positions
  std::vector<float> q;    ///< [T, kGqa, head_dim]
  std::vector<float> q16;  ///< q rounded to fp16, as every kernel takes it (rounding point (1))
  std::optional<ref::KvLayer> layer;
};

/// Rows also go to `also_append` (k, v, n: host f32) when set: the GPU's layer.
using Appender = std::function<void(const float*, const float*, std::int64_t)>;

Setup build(int head_dim, std::int64_t keys, int rows, Data data, std::mt19937_64& rng,
            const Appender& also_append) {
  Setup s;
  s.rows = rows;
  s.g.n_kv_heads = 1;
  s.g.head_dim_k = s.g.head_dim_v = head_dim;
  s.g.max_ctx = keys;
  s.layer.emplace(s.g, std::max(rows, 1));
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int D = head_dim;
  // Peaked data: a unit direction u; four needle keys k = g·u, so that a query near √D·u
  // scores them g = 11 … 14 above a bulk of scores ~ N(0, 1) (at 128K keys the bulk still holds
  // about a quarter of the weight); the needles sit at the first key, the middle, three quarters
  // in and at the last key (the last split's only one), and their values are ±4 on a random sign
  // pattern, so that a shift of weight between them moves every output element.
  std::vector<float> u(static_cast<std::size_t>(D)), signs(static_cast<std::size_t>(D));
  double norm = 0;
  for (float& x : u) {
    x = normal(rng);
    norm += double(x) * x;
  }
  for (float& x : u) x = float(x / std::sqrt(norm));
  for (float& x : signs) x = uniform(rng) < 0 ? -1.0f : 1.0f;
  const std::int64_t needles[] = {0, keys / 2, keys * 3 / 4, keys - 1};
  for (std::int64_t at = 0; at < keys; at += kChunk) {
    const std::int64_t n = std::min(kChunk, keys - at);
    std::vector<float> k(std::size_t(n * D)), v(std::size_t(n * D));
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    if (data == Data::peaked)
      for (int j = 0; j < 4; ++j) {
        const std::int64_t row = needles[j] - at;
        if (row < 0 || row >= n) continue;
        for (int d = 0; d < D; ++d) {
          k[std::size_t(row * D + d)] = float(11 + j) * u[std::size_t(d)];
          v[std::size_t(row * D + d)] = (j % 2 ? -4.0f : 4.0f) * signs[std::size_t(d)];
        }
      }
    s.layer->append(ref::RowsView{k.data(), v.data(), n, DType::f32});
    if (also_append) also_append(k.data(), v.data(), n);
  }
  s.q.resize(std::size_t(rows * kGqa * D));
  for (int h = 0; h < rows * kGqa; ++h)
    for (int d = 0; d < D; ++d)
      s.q[std::size_t(h * D + d)] =
          data == Data::peaked
              ? float(std::sqrt(double(D)) * (u[std::size_t(d)] + 0.1 * normal(rng) / std::sqrt(D)))
              : uniform(rng);
  for (const float x : s.q) s.q16.push_back(f16_bits_to_f32(f32_to_f16_bits(x)));
  return s;
}

/// The float64 attention of every query head of query row `row` over keys [0, n) of k and v, by
/// parts: the sums over all of them and over the last split (from split_begin), for the closed
/// forms of the planted errors.
struct Parts {
  // [head][e]
  std::vector<std::vector<double>> a, a_split;
  std::vector<double> l, l_split;
};

Parts attend(const Setup& s, int row, std::int64_t n, double scale, std::int64_t split_begin,
             const std::vector<std::vector<double>>& k, const std::vector<std::vector<double>>& v) {
  const int D = s.g.head_dim_k;
  const float* q16 = s.q16.data() + std::size_t(row) * kGqa * std::size_t(D);
  Parts p;
  p.a.assign(kGqa, std::vector<double>(std::size_t(D), 0.0));
  p.a_split = p.a;
  p.l.assign(kGqa, 0.0);
  p.l_split.assign(kGqa, 0.0);
  // One thread per query head: a 128K-key verify sweep is minutes of float64 arithmetic.
  const auto one_head = [&](int h) {
    std::vector<double> score(static_cast<std::size_t>(n));
    double top = -INFINITY;
    for (std::int64_t t = 0; t < n; ++t) {
      double dot = 0;
      for (int d = 0; d < D; ++d)
        dot += double(q16[std::size_t(h * D + d)]) * k[std::size_t(t)][std::size_t(d)];
      score[std::size_t(t)] = scale * dot;
      top = std::max(top, score[std::size_t(t)]);
    }
    for (std::int64_t t = 0; t < n; ++t) {
      const double w = std::exp(score[std::size_t(t)] - top);
      p.l[std::size_t(h)] += w;
      if (t >= split_begin) p.l_split[std::size_t(h)] += w;
      for (int e = 0; e < D; ++e) {
        const double x = w * v[std::size_t(t)][std::size_t(e)];
        p.a[std::size_t(h)][std::size_t(e)] += x;
        if (t >= split_begin) p.a_split[std::size_t(h)][std::size_t(e)] += x;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int h = 0; h < kGqa; ++h) threads.emplace_back(one_head, h);
  for (std::thread& t : threads) t.join();
  return p;
}

/// With the GPU: its output plus a plant's effect (planted − clean float64 attention), the GPU
/// exact but for its own rounding and the planted error.
std::vector<double> on_gpu(const std::vector<float>& got, const std::vector<double>& planted,
                           const std::vector<double>& clean) {
  std::vector<double> out(got.size());
  for (std::size_t i = 0; i < got.size(); ++i) out[i] = double(got[i]) + (planted[i] - clean[i]);
  return out;
}

/// The larger |z| of the statistical check's two signatures over one launch's output.
double launch_z(const std::vector<double>& got, const ref::DecodeBound& b) {
  ref::SystematicCheck c;
  for (std::size_t i = 0; i < got.size(); ++i)
    c.record(got[i], b.rounded[i], b.bound[i] - b.exact_q[i]);
  return std::max(std::fabs(c.current_z(ref::SystematicCheck::output)),
                  std::fabs(c.current_z(ref::SystematicCheck::constant)));
}

/// The declared check (ref::SystematicCheck, accuracy.hpp's noise model) over x, row by row (a
/// verify's row is the decode of its own view, the check's unit): the largest row energy,
/// mean(((x − expected)/sigma)²), and the largest |x − expected|/sigma.
struct Declared {
  double energy = 0, ratio = 0;
};

Declared declared_check(const std::vector<double>& x, const ref::DecodeBound& b, int rows) {
  const std::size_t per_row = x.size() / std::size_t(rows);
  ref::SystematicCheck c;
  Declared d;
  for (std::size_t i = 0; i < x.size(); ++i) {
    c.record(x[i], b.rounded[i], b, i);
    if ((i + 1) % per_row == 0) {
      d.energy = std::max(d.energy, c.current_energy());
      c.end_launch();
    }
  }
  d.ratio = c.max_noise_ratio();
  return d;
}

/// --save / --load: a GPU decode's output and accumulation shape, so that the sweep can be
/// replayed without a GPU (the model of accuracy.hpp studied against real GPU rounding).
std::string saved_name(const std::string& dir, int D, std::int64_t keys, const char* data,
                       int rows) {
  return dir + "/d" + std::to_string(D) + "_k" + std::to_string(keys) + "_" + data + "_t" +
         std::to_string(rows);
}

void save_output(const std::string& name, const std::vector<float>& got,
                 const AccumulationShape& s) {
  std::FILE* f = std::fopen((name + ".f32").c_str(), "wb");
  if (!f || std::fwrite(got.data(), sizeof(float), got.size(), f) != got.size())
    throw Error(ErrorKind::refused, "sensitivity: cannot write " + name + ".f32");
  std::fclose(f);
  f = std::fopen((name + ".shape").c_str(), "w");
  if (!f) throw Error(ErrorKind::refused, "sensitivity: cannot write " + name + ".shape");
  std::fprintf(f, "%lld %lld %lld %d %lld %d\n", (long long)s.max_keys_per_split,
               (long long)s.n_splits, (long long)s.rescales, s.tensor_core ? 1 : 0,
               (long long)s.pv_mma_steps, s.k_fused_f16 ? 1 : 0);
  std::fclose(f);
}

std::vector<float> load_output(const std::string& name, std::size_t values, AccumulationShape& s) {
  std::vector<float> got(values);
  std::FILE* f = std::fopen((name + ".f32").c_str(), "rb");
  if (!f || std::fread(got.data(), sizeof(float), values, f) != values)
    throw Error(ErrorKind::refused, "sensitivity: cannot read " + std::to_string(values) +
                                        " values from " + name + ".f32");
  std::fclose(f);
  f = std::fopen((name + ".shape").c_str(), "r");
  long long a = 0, b = 0, c = 0, e = 0;
  int tc = 0, fused = 0;  // files saved before the fused shape have no sixth field
  if (!f || std::fscanf(f, "%lld %lld %lld %d %lld", &a, &b, &c, &tc, &e) != 5 ||
      std::fscanf(f, "%d", &fused) > 1)
    throw Error(ErrorKind::refused, "sensitivity: cannot read " + name + ".shape");
  std::fclose(f);
  s.max_keys_per_split = a;
  s.n_splits = b;
  s.rescales = c;
  s.tensor_core = tc != 0;
  s.pv_mma_steps = e;
  s.k_fused_f16 = fused != 0;
  return got;
}

/// The largest |planted − clean| / bound over the output (the bound from ref::decode_bound).
double worst_ratio(const std::vector<double>& planted, const std::vector<double>& clean,
                   const ref::DecodeBound& b) {
  double worst = 0;
  for (std::size_t i = 0; i < clean.size(); ++i)
    if (b.bound[i] > 0) worst = std::max(worst, std::fabs(planted[i] - clean[i]) / b.bound[i]);
  return worst;
}

int run(const std::vector<std::string>& args) {
  const Options o(args, {"longest", "seed", "rows", "head-dim", "save", "load"},
                  {"gpu", "require-resolution"});
  const std::int64_t longest = o.integer("longest", kBuckets[4], 1, kBuckets[4]);
  const int rows = int(o.integer("rows", 1, 1, cuda::kMaxVerify));
  const std::string save = o.get("save").value_or(""), load = o.get("load").value_or("");
  if (!save.empty() && !o.flag("gpu")) throw UsageError("--save needs --gpu");
  if (!load.empty() && o.flag("gpu")) throw UsageError("--load replays a saved GPU run: no --gpu");
  const bool gpu = o.flag("gpu") || !load.empty();  // with a GPU's output, live or saved
  const bool require = o.flag("require-resolution");
  if (require && !gpu)
    throw UsageError("--require-resolution needs a GPU's output (--gpu or --load)");
  // Issue #34's targets for the declared check on peaked data, and clean launches that pass it.
  std::vector<std::string> misses;
  const int only_head_dim = int(o.integer("head-dim", 0, 0, 1 << 20));
  if (only_head_dim != 0 && !cuda::head_dim_supported(only_head_dim))
    throw UsageError("--head-dim " + std::to_string(only_head_dim) +
                     " is not a supported head dim (" + cuda::supported_head_dims() + ")");
#ifndef KVLAYER_WITH_CUDA
  if (o.flag("gpu"))
    throw UsageError("--gpu needs a build with the CUDA layer (this one has none)");
#endif
  std::mt19937_64 rng(std::uint64_t(o.integer("seed", 1, 0, INT64_MAX)));
  std::printf(
      "kvlayer sensitivity: the smallest planted relative error 2^-k (k = %d..%d) whose decode "
      "leaves the bound\n(reference, float64; 1 KV head, gqa %d; '-' none caught down to "
      "2^-%d; drop: the largest |error|/bound when the first or last key is left out; no plant:\n"
      "the same for fp16(q) alone, e_q/bound)\n%s\n",
      kLastExponent, kFirstExponent, kGqa, kFirstExponent,
      rows == 1 ? ""
                : ("verify of T = " + std::to_string(rows) +
                   " rows: every row planted, "
                   "the largest ratio over all rows\n")
                      .c_str());
  if (gpu)
    std::printf(
        "GPU mode%s: each plant's effect is added to the CUDA layer's own decode of the same\n"
        "rows (its real rounding); a cell reads bound/8sigma/declared/E12: the smallest 2^-k that\n"
        "leaves the bound / that puts an element 8 sigma from the noise model's expected value /\n"
        "that the declared check catches (the launch's energy mean(((x - expected)/sigma)^2) >=\n"
        "%g; accuracy.hpp, noise model), and that energy with the plant at 2^-12; drop cells\n"
        "read |error|/bound, |z|; the no-plant cell |error|/bound, |z|, |error|/sigma, energy\n\n",
        load.empty() ? "" : (" (replayed from " + load + ")").c_str(),
        ref::SystematicCheck::kNoiseThreshold);
  std::printf("%-4s %-7s %-7s", "D", "keys", "data");
  for (Plant p : kPlants) std::printf(" %26s", plant_name(p));
  std::printf(" %16s %16s %16s  %s\n", "drop first", "drop last", "no plant", "self-check");
  for (const int D : cuda::kSupportedHeadDims) {
    if (only_head_dim != 0 && D != only_head_dim) continue;
    for (const std::int64_t keys : kBuckets) {
      if (keys > longest) continue;
      for (const Data data : {Data::normal, Data::peaked}) {
        Appender also_append;
        std::vector<float> got;  // the GPU's decode (GPU mode)
#ifdef KVLAYER_WITH_CUDA
        std::optional<GpuDecode> device;
        if (gpu && load.empty()) {
          Geometry g;
          g.n_kv_heads = 1;
          g.head_dim_k = g.head_dim_v = D;
          g.max_ctx = keys;
          device.emplace(g, kGqa, rows);
          also_append = [&](const float* k, const float* v, std::int64_t n) {
            device->append(k, v, n);
          };
        }
#endif
        const Setup s = build(D, keys, rows, data, rng, also_append);
        const ref::KvLayer& layer = *s.layer;
        std::int64_t per = 0;
        AccumulationShape shape = nominal_shape(keys, &per);
#ifdef KVLAYER_WITH_CUDA
        if (device) {
          got = device->decode_rows(s.q, rows);
          shape =
              rows == 1 ? device->accumulation_shape() : device->verify_accumulation_shape(rows);
          if (!save.empty())
            save_output(saved_name(save, D, keys, data_name(data), rows), got, shape);
        }
#endif
        if (!load.empty())
          got = load_output(saved_name(load, D, keys, data_name(data), rows),
                            std::size_t(rows) * kGqa * std::size_t(D), shape);
        // Row i attends keys [0, view_end[i]): the whole view for a decode, the causal views
        // of the last T positions for a verify (SPEC §11).
        const std::vector<ref::DecodeView> views =
            rows == 1 ? std::vector<ref::DecodeView>{{0, keys, 0}} : layer.verify_views(rows);
        const std::vector<double> clean_ref =
            rows == 1 ? layer.decode(s.q, kGqa, std::nullopt)
                      : layer.decode_rows(s.q, kGqa, rows, std::nullopt);
        ref::DecodeBound b;
        for (const ref::DecodeBound& row_bound :
             ref::decode_rows_bound(layer, s.q, kGqa, std::nullopt, views, shape))
          b.append(row_bound);
        std::vector<std::vector<double>> k(static_cast<std::size_t>(keys)),
            v(static_cast<std::size_t>(keys));
        // A fused shape multiplies K̃ = fp16(d·q) (accuracy.hpp (1)); the sweep's |K| < 20 never
        // reaches a block beyond the fold, so every key takes K̃.
        const bool k_tilde = shape.tensor_core && shape.k_fused_f16;
        for (std::int64_t t = 0; t < keys; ++t) {
          const auto kr = layer.dequantized_head(Plane::k, t, 0);
          const auto vr = layer.dequantized_head(Plane::v, t, 0);
          k[std::size_t(t)].assign(kr.begin(), kr.end());
          if (k_tilde)
            for (double& x : k[std::size_t(t)]) x = ref::round_to_f16(x);
          v[std::size_t(t)].assign(vr.begin(), vr.end());
        }
        const double scale = ref::default_scale(D);
        // Each row's last split starts at the last multiple of the split length below its end.
        const auto split_begin = [&](std::int64_t end) { return (end - 1) / per * per; };
        const auto output = [&](const std::vector<Parts>& parts, double pv, double weight) {
          // Row by row: o = (A + pv·A_s + weight·A_s) / (L + weight·L_s)
          std::vector<double> out;
          for (const Parts& p : parts)
            for (int h = 0; h < kGqa; ++h)
              for (int e = 0; e < D; ++e)
                out.push_back((p.a[std::size_t(h)][std::size_t(e)] +
                               (pv + weight) * p.a_split[std::size_t(h)][std::size_t(e)]) /
                              (p.l[std::size_t(h)] + weight * p.l_split[std::size_t(h)]));
          return out;
        };
        // Every row's parts over k, v, where `dropped` (if ≥ 0) was erased from them.
        const auto attend_rows = [&](double row_scale, const std::vector<std::vector<double>>& kk,
                                     const std::vector<std::vector<double>>& vv,
                                     std::int64_t dropped) {
          std::vector<Parts> parts;
          for (int i = 0; i < rows; ++i) {
            const std::int64_t end = views[std::size_t(i)].end;
            const std::int64_t n = end - (dropped >= 0 && dropped < end ? 1 : 0);
            parts.push_back(attend(s, i, n, row_scale, split_begin(end), kk, vv));
          }
          return parts;
        };
        const std::vector<Parts> clean_parts = attend_rows(scale, k, v, -1);
        const std::vector<double> clean = output(clean_parts, 0, 0);
        // The own attention of fp16(q) (and K̃) must be the reference's õ (same values, another
        // summation order).
        double self = 0;
        for (std::size_t i = 0; i < clean.size(); ++i)
          self = std::max(self, std::fabs(clean[i] - b.rounded[i]) / b.bound[i]);
        std::printf("%-4d %-7lld %-7s", D, (long long)keys, data_name(data));
        const double tau = ref::SystematicCheck::kNoiseThreshold;
        for (const Plant plant : kPlants) {
          // The smallest 2^-k the bound catches, that puts an element at 8 sigma, and (GPU)
          // that the declared check catches (the launch's energy ≥ tau); its energy at 2^-12.
          int caught = 0, sigmas = 0, declared = 0;
          double e12 = 0;
          for (int e = kLastExponent;
               e >= kFirstExponent && (caught == 0 || sigmas == 0 || (gpu && declared == 0)); --e) {
            const double eps = std::ldexp(1.0, -e);
            std::vector<double> planted;
            switch (plant) {
              case Plant::scale:
                planted = output(attend_rows(scale * (1 + eps), k, v, -1), 0, 0);
                break;
              case Plant::split_weight:
                planted = output(clean_parts, 0, eps);
                break;
              case Plant::pv_split:
                planted = output(clean_parts, eps, 0);
                break;
              case Plant::v_dequant:
                planted = clean;
                for (double& x : planted) x *= 1 + eps;
                break;
            }
            const double level = ref::SystematicCheck::kNoiseLevels[2];
            if (!gpu) {
              if (caught == 0 && worst_ratio(planted, clean_ref, b) > 1) caught = e;
              continue;
            }
            const std::vector<double> seen = on_gpu(got, planted, clean);
            if (caught == 0 && worst_ratio(seen, clean_ref, b) > 1) caught = e;
            const Declared check = declared_check(seen, b, rows);
            if (sigmas == 0 && check.ratio >= level) sigmas = e;
            const double energy = check.energy;
            if (declared == 0 && energy >= tau) declared = e;
            if (e == 12) e12 = energy;
          }
          const auto cell = [](int k) { return k ? "2^-" + std::to_string(k) : std::string("-"); };
          char es[32];
          std::snprintf(es, sizeof es, "/%.3g", e12);
          const std::string all =
              gpu ? cell(caught) + "/" + cell(sigmas) + "/" + cell(declared) + es : cell(caught);
          const int target = keys <= 4096 ? 12 : 10;
          if (gpu && data == Data::peaked && (declared == 0 || declared < target))
            misses.push_back("D " + std::to_string(D) + ", " + std::to_string(keys) + " keys, " +
                             plant_name(plant) + ": " +
                             (declared ? "2^-" + std::to_string(declared) : std::string("none")) +
                             " (target 2^-" + std::to_string(target) + ")");
          std::printf(" %26s", all.c_str());
        }
        for (const std::int64_t dropped : {std::int64_t(0), keys - 1}) {
          if (keys < 2) {
            std::printf(" %12s", "n/a");
            continue;
          }
          std::vector<std::vector<double>> k2 = k, v2 = v;
          k2.erase(k2.begin() + dropped);
          v2.erase(v2.begin() + dropped);
          const std::vector<double> planted = output(attend_rows(scale, k2, v2, dropped), 0, 0);
          if (gpu) {
            const std::vector<double> seen = on_gpu(got, planted, clean);
            std::printf(" %9.3g,%6.3g", worst_ratio(seen, clean_ref, b), launch_z(seen, b));
          } else {
            std::printf(" %16.3g", worst_ratio(planted, clean_ref, b));
          }
        }
        if (gpu) {
          const std::vector<double> seen(got.begin(), got.end());
          const Declared check = declared_check(seen, b, rows);
          if (check.energy >= tau)
            misses.push_back("D " + std::to_string(D) + ", " + std::to_string(keys) + " keys, " +
                             data_name(data) + ": the clean launch alarms");
          std::printf(" %9.3g,%6.3g,%6.3g,%8.3g", worst_ratio(seen, clean_ref, b),
                      launch_z(seen, b), check.ratio, check.energy);
        } else {
          std::printf(" %16.3g", worst_ratio(clean, clean_ref, b));
        }
        std::printf("  %.2g of the bound\n", self);
        std::fflush(stdout);
        if (!(self < 0.01))
          throw Error(ErrorKind::refused,
                      "sensitivity: the sweep's own attention differs from the reference decode "
                      "by " +
                          std::to_string(self) + " of the bound (D " + std::to_string(D) + ", " +
                          std::to_string(keys) + " keys)");
      }
    }
  }
  if (gpu) {
    std::printf(
        "resolution: %s (the declared check on peaked data: 2^-12 at <= 4K keys, 2^-10 "
        "beyond; clean launches below the threshold)\n",
        misses.empty() ? "PASS" : "FAIL");
    for (const std::string& m : misses) std::printf("  missed: %s\n", m.c_str());
  }
  return require && !misses.empty() ? kExitFailure : kExitOk;
}

}  // namespace

const Command& sensitivity_command() {
  static const Command c{
      "sensitivity", "the smallest systematic decode error the bound catches, per view length",
      "usage: kvlayer sensitivity [--longest N] [--seed S] [--rows T] [--head-dim D] [--gpu]\n"
      "                           [--save DIR | --load DIR]\n"
      "  On the reference (float64, no GPU): for each supported head dim, view length (1K, 4K,\n"
      "  16K, 64K, 128K keys, up to N) and data kind (normal; peaked: four dominant keys with\n"
      "  distinct values, at the first key, the middle, three quarters in and the last key), "
      "plants\n"
      "  relative errors 2^-14 … 2^-8 in the softmax scale, the last split's merge weight, its\n"
      "  P.V sum and the V dequantization, and prints the smallest one whose decode leaves\n"
      "  ref::decode_bound somewhere, and how far outside the bound a dropped first or last key\n"
      "  lands (> 1: caught). A self-check compares the sweep's attention with the reference.\n"
      "  --rows T (1..64, default 1): T ≥ 2 sweeps a verify decode of the view's last T\n"
      "  positions instead (each row its own causal view, planted alike, one bound per row).\n"
      "  --gpu (CUDA builds): the same rows also in a CUDA layer; each plant's effect is added\n"
      "  to its decode (the GPU's own rounding stays in), the bound is the launch's, and each\n"
      "  cell also gives the smallest plant the declared check catches (accuracy.hpp, noise\n"
      "  model) and the launch's energy with the plant at 2^-12.\n"
      "  --save DIR (with --gpu): also writes each GPU output and its accumulation shape to DIR;\n"
      "  --load DIR (any build): replays them instead of a GPU (same --seed and options).\n"
      "  With a GPU's output a last line reads \"resolution: PASS\" when the declared check\n"
      "  catches every plant on peaked data at 2^-12 (<= 4K keys) or 2^-10 (longer) and no clean\n"
      "  launch alarms; --require-resolution makes a FAIL the exit status (1).\n"
      "  --head-dim D: that head dim only (default: every supported one).\n"
      "  Defaults: N 131072, S 1.\n",
      run};
  return c;
}

}  // namespace kvlayer::cli
