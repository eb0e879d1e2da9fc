#include "kvlayer/reference/systematic_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvlayer::ref {
namespace {

double sigma(SystematicCheck::Signature s, double rounded) {
  return s == SystematicCheck::output ? rounded : 1.0;
}

}  // namespace

void SystematicCheck::record(double got, double rounded, double noise_scale) {
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
  ++in_launch_;
}

double SystematicCheck::current_z(Signature s) const {
  return sum_r2_sigma2_[s] > 0 ? sum_r_sigma_[s] / std::sqrt(sum_r2_sigma2_[s]) : 0.0;
}

void SystematicCheck::end_launch() {
  if (in_launch_ >= kMinElements) {
    ++launches_;
    elements_ += in_launch_;
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
  in_launch_ = 0;
}

void SystematicCheck::add(const SystematicCheck& o) {
  launches_ += o.launches_;
  elements_ += o.elements_;
  small_launches_ += o.small_launches_;
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

std::string SystematicCheck::summary() const {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "systematic check (report only): %lld launches of >= %lld elements (%lld "
                "elements, %lld smaller launches left out); |z| along o~ p50 %.3g p99 %.3g max "
                "%.3g (%lld >= %g), along 1 p50 %.3g p99 %.3g max %.3g (%lld >= %g)",
                static_cast<long long>(launches_), static_cast<long long>(kMinElements),
                static_cast<long long>(elements_), static_cast<long long>(small_launches_),
                abs_z(output, 0.5), abs_z(output, 0.99), max_abs_z_[output],
                static_cast<long long>(alarms_[output]), kReportZ, abs_z(constant, 0.5),
                abs_z(constant, 0.99), max_abs_z_[constant],
                static_cast<long long>(alarms_[constant]), kReportZ);
  return buf;
}

}  // namespace kvlayer::ref
