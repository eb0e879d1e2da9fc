#include "kvlayer/reference/systematic_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvlayer::ref {
namespace {

double sigma(SystematicCheck::Signature s, double rounded) {
  return s == SystematicCheck::output ? rounded : 1.0;
}

/// The smallest relative errors β ≥ 0 along õ, one per sign, that take an element d away from
/// its reference to |d + β·õ| ≥ level, folded into up and down: from d's side (level − |d|)/|õ|,
/// across zero first (level + |d|)/|õ|.
void reach(double d, double o, double level, double& up, double& down) {
  const double toward = std::max(0.0, (level - std::fabs(d)) / std::fabs(o));
  const double across = (level + std::fabs(d)) / std::fabs(o);
  const bool same = d * o >= 0;
  up = std::min(up, same ? toward : across);
  down = std::min(down, same ? across : toward);
}

}  // namespace

void SystematicCheck::record(double got, double want, const DecodeBound& b, std::size_t i) {
  const double bound = b.bound[i], o = b.rounded[i];
  const double d = got - want;
  if (std::isfinite(d) && std::isfinite(o) && o != 0) reach(d, o, bound, bound_up_, bound_down_);
  if (i < b.sigma.size() && b.sigma[i] > 0 && std::isfinite(b.sigma[i]) && std::isfinite(got) &&
      std::isfinite(b.expected[i])) {
    const double sg = b.sigma[i], c = b.expected[i], r = got - c, ratio = std::fabs(r) / sg;
    ++noise_elements_;
    ++noise_in_launch_;
    max_noise_ratio_ = std::max(max_noise_ratio_, ratio);
    for (std::size_t k = 0; k < noise_counts_.size(); ++k)
      if (ratio >= kNoiseLevels[k]) ++noise_counts_[k];
    if (c != 0) reach(r, c, kNoiseLevels[2] * sg, noise_up_, noise_down_);
    const double rho = r / sg, kappa = c / sg;
    energy_rr_ += rho * rho;
    energy_rk_ += rho * kappa;
    energy_kk_ += kappa * kappa;
  }
  record_residual(got, o, bound - b.exact_q[i]);
}

double SystematicCheck::current_noise_resolution() const {
  if (noise_in_launch_ == 0) return INFINITY;
  return std::max(noise_up_, noise_down_);
}

double SystematicCheck::noise_resolution(double q) const {
  return resolution_at(noise_histogram_, noise_launches_, q);
}

double SystematicCheck::current_energy() const {
  return noise_in_launch_ > 0 ? energy_rr_ / double(noise_in_launch_) : 0.0;
}

double SystematicCheck::current_energy_resolution() const {
  // Σ(ρ + βκ)² ≥ τ·n ⇔ Σκ²·β² ± 2·Σρκ·β + (Σρ² − τ·n) ≥ 0: the positive root of the worse sign.
  if (noise_in_launch_ == 0 || !(energy_kk_ > 0)) return INFINITY;
  const double a = energy_kk_, b = 2 * std::fabs(energy_rk_),
               c = energy_rr_ - kNoiseThreshold * double(noise_in_launch_);
  if (c >= 0) return 0;  // already an alarm
  // The sign that lowers the energy first (b > 0 against it) needs the larger β.
  return (b + std::sqrt(b * b - 4 * a * c)) / (2 * a);
}

double SystematicCheck::energy(double q) const {
  return resolution_at(energy_histogram_, noise_launches_, q);
}

double SystematicCheck::energy_resolution(double q) const {
  return resolution_at(energy_resolution_histogram_, noise_launches_, q);
}

void SystematicCheck::record(double got, double rounded, double noise_scale) {
  ++unbounded_;
  record_residual(got, rounded, noise_scale);
}

void SystematicCheck::record_residual(double got, double rounded, double noise_scale) {
  if (!(noise_scale > 0) || !std::isfinite(noise_scale) || !std::isfinite(got) ||
      !std::isfinite(rounded))
    return;
  // w = 1/a: each element enters as its residual in units of its own noise scale.
  const double r = (got - rounded) / noise_scale;
  for (int s = 0; s < kSignatures; ++s) {
    const double x = sigma(Signature(s), rounded);
    sum_r_sigma_[s] += r * x;
    sum_r2_sigma2_[s] += r * r * x * x;
  }
  const double o = rounded, kappa = rounded / noise_scale;
  a_ += o * r;
  b_ += o * kappa;
  c_ += o * o * r * r;
  d_ += o * o * r * kappa;
  e_ += o * o * kappa * kappa;
  ++in_launch_;
}

double SystematicCheck::current_bound_resolution() const {
  if (in_launch_ == 0 || unbounded_ > 0) return INFINITY;
  return std::max(bound_up_, bound_down_);
}

double SystematicCheck::current_statistic_resolution() const {
  // |z(β)| ≥ k ⇔ f(β) = (B² − k²E)β² + 2(AB − k²D)β + (A² − k²C) ≥ 0.
  const double k2 = kReportZ * kReportZ;
  const double qa = b_ * b_ - k2 * e_, qb = 2 * (a_ * b_ - k2 * d_), qc = a_ * a_ - k2 * c_;
  if (in_launch_ == 0 || !(c_ > 0 || e_ > 0)) return INFINITY;
  if (qc >= 0) return 0;  // already at |z| ≥ k
  // The smallest β > 0 with f(β) ≥ 0, for f and for f(−β) (the other sign).
  const auto smallest = [](double a, double b, double c) {  // c < 0
    const double disc = b * b - 4 * a * c;
    if (disc < 0) return double(INFINITY);
    const double r = std::sqrt(disc);
    if (a == 0) return b > 0 ? -c / b : double(INFINITY);
    double best = INFINITY;
    for (const double x : {(-b - r) / (2 * a), (-b + r) / (2 * a)})
      if (x > 0) best = std::min(best, x);
    return best;
  };
  return std::max(smallest(qa, qb, qc), smallest(qa, -qb, qc));
}

int SystematicCheck::resolution_bin(double beta) {
  if (!std::isfinite(beta)) return kResolutionBins - 1;
  if (beta <= std::ldexp(1.0, -40)) return 0;
  return std::min(kResolutionBins - 2, int(std::ceil((std::log2(beta) + 40) * 4)));
}

double SystematicCheck::resolution_at(const std::vector<std::int64_t>& histogram,
                                      std::int64_t total, double q) {
  if (total == 0) return INFINITY;
  const auto want = std::max<std::int64_t>(1, std::int64_t(std::ceil(q * double(total))));
  std::int64_t seen = 0;
  for (int i = 0; i < kResolutionBins; ++i) {
    seen += histogram[std::size_t(i)];
    if (seen >= want) return i == kResolutionBins - 1 ? INFINITY : std::exp2(i / 4.0 - 40);
  }
  return INFINITY;
}

double SystematicCheck::bound_resolution(double q) const {
  return resolution_at(bound_histogram_, bound_launches_, q);
}

double SystematicCheck::statistic_resolution(double q) const {
  return resolution_at(statistic_histogram_, launches_, q);
}

double SystematicCheck::current_z(Signature s) const {
  return sum_r2_sigma2_[s] > 0 ? sum_r_sigma_[s] / std::sqrt(sum_r2_sigma2_[s]) : 0.0;
}

void SystematicCheck::end_launch() {
  if (in_launch_ >= kMinElements) {
    ++launches_;
    elements_ += in_launch_;
    ++statistic_histogram_[std::size_t(resolution_bin(current_statistic_resolution()))];
    if (unbounded_ == 0) {
      ++bound_launches_;
      ++bound_histogram_[std::size_t(resolution_bin(current_bound_resolution()))];
    }
    if (noise_in_launch_ > 0) {
      ++noise_launches_;
      ++noise_histogram_[std::size_t(resolution_bin(current_noise_resolution()))];
      const double e = current_energy();
      max_energy_ = std::max(max_energy_, e);
      if (e >= kNoiseThreshold) ++noise_alarms_;
      ++energy_histogram_[std::size_t(resolution_bin(e > 0 ? e : std::ldexp(1.0, -41)))];
      ++energy_resolution_histogram_[std::size_t(resolution_bin(current_energy_resolution()))];
    }
    for (int s = 0; s < kSignatures; ++s) {
      const double z = std::fabs(current_z(Signature(s)));
      max_abs_z_[s] = std::max(max_abs_z_[s], z);
      if (z >= kReportZ) ++alarms_[s];
      ++histogram_[s][std::size_t(std::min(kBins - 1, int(z / kBinWidth)))];
    }
  } else if (in_launch_ > 0) {
    ++small_launches_;
  }
  sum_r_sigma_ = {};
  sum_r2_sigma2_ = {};
  a_ = b_ = c_ = d_ = e_ = 0;
  bound_up_ = bound_down_ = INFINITY;
  noise_up_ = noise_down_ = INFINITY;
  noise_in_launch_ = 0;
  energy_rr_ = energy_rk_ = energy_kk_ = 0;
  unbounded_ = 0;
  in_launch_ = 0;
}

void SystematicCheck::add(const SystematicCheck& o) {
  launches_ += o.launches_;
  elements_ += o.elements_;
  small_launches_ += o.small_launches_;
  bound_launches_ += o.bound_launches_;
  noise_launches_ += o.noise_launches_;
  noise_elements_ += o.noise_elements_;
  max_noise_ratio_ = std::max(max_noise_ratio_, o.max_noise_ratio_);
  max_energy_ = std::max(max_energy_, o.max_energy_);
  noise_alarms_ += o.noise_alarms_;
  for (std::size_t k = 0; k < noise_counts_.size(); ++k) noise_counts_[k] += o.noise_counts_[k];
  for (int b = 0; b < kResolutionBins; ++b) {
    bound_histogram_[std::size_t(b)] += o.bound_histogram_[std::size_t(b)];
    statistic_histogram_[std::size_t(b)] += o.statistic_histogram_[std::size_t(b)];
    noise_histogram_[std::size_t(b)] += o.noise_histogram_[std::size_t(b)];
    energy_histogram_[std::size_t(b)] += o.energy_histogram_[std::size_t(b)];
    energy_resolution_histogram_[std::size_t(b)] += o.energy_resolution_histogram_[std::size_t(b)];
  }
  for (int s = 0; s < kSignatures; ++s) {
    max_abs_z_[s] = std::max(max_abs_z_[s], o.max_abs_z_[s]);
    alarms_[s] += o.alarms_[s];
    for (int b = 0; b < kBins; ++b)
      histogram_[s][std::size_t(b)] += o.histogram_[s][std::size_t(b)];
  }
}

double SystematicCheck::abs_z(Signature s, double q) const {
  if (launches_ == 0) return 0;
  const auto want = std::max<std::int64_t>(1, std::int64_t(std::ceil(q * double(launches_))));
  std::int64_t seen = 0;
  for (int b = 0; b < kBins; ++b) {
    seen += histogram_[s][std::size_t(b)];
    if (seen >= want)
      return b == kBins - 1 ? max_abs_z_[s] : std::min(max_abs_z_[s], (b + 1) * kBinWidth);
  }
  return max_abs_z_[s];
}

std::string SystematicCheck::summary(const std::string& path) const {
  const auto beta = [](double x) {
    if (!std::isfinite(x)) return std::string("none");
    if (x == 0) return std::string("0");
    char b[32];
    std::snprintf(b, sizeof b, "2^%.2g", std::log2(x));
    return std::string(b);
  };
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "systematic check%s: %lld launches of >= %lld elements (%lld elements, %lld "
                "smaller launches left out); |z| (report only) along o~ p50 %.3g p99 %.3g max "
                "%.3g (%lld >= %g), along 1 p50 %.3g p99 %.3g max %.3g (%lld >= %g)",
                path.empty() ? "" : (" [" + path + "]").c_str(), static_cast<long long>(launches_),
                static_cast<long long>(kMinElements), static_cast<long long>(elements_),
                static_cast<long long>(small_launches_), abs_z(output, 0.5), abs_z(output, 0.99),
                max_abs_z_[output], static_cast<long long>(alarms_[output]), kReportZ,
                abs_z(constant, 0.5), abs_z(constant, 0.99), max_abs_z_[constant],
                static_cast<long long>(alarms_[constant]), kReportZ);
  return std::string(buf) + "; smallest relative output error caught per launch: bound p50 " +
         beta(bound_resolution(0.5)) + " p90 " + beta(bound_resolution(0.9)) + " (" +
         std::to_string(bound_launches_) + " launches), statistic p50 " +
         beta(statistic_resolution(0.5)) + " p90 " + beta(statistic_resolution(0.9)) +
         "; noise model: max |GPU - expected|/sigma " +
         [&] {
           char b[32];
           std::snprintf(b, sizeof b, "%.3g", max_noise_ratio_);
           return std::string(b);
         }() +
         ", elements >= 2: " + std::to_string(noise_counts_[0]) +
         ", >= 4: " + std::to_string(noise_counts_[1]) +
         ", >= 8: " + std::to_string(noise_counts_[2]) + " of " + std::to_string(noise_elements_) +
         "; 8 sigma reached per launch by p50 " + beta(noise_resolution(0.5)) + " p90 " +
         beta(noise_resolution(0.9)) + "; declared check: energy per launch p50 " +
         beta(energy(0.5)) + " p99 " + beta(energy(0.99)) + " max " + beta(max_energy_) + ", " +
         std::to_string(noise_alarms_) + " of " + std::to_string(noise_launches_) +
         " launches >= " + std::to_string(int(kNoiseThreshold)) +
         " (alarms); the threshold reached by p50 " + beta(energy_resolution(0.5)) + " p90 " +
         beta(energy_resolution(0.9));
}

}  // namespace kvlayer::ref
