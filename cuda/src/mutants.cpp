#include "mutants.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/half.hpp"

namespace kvlayer::cuda::detail {

const char* mutant_name(Mutant m) {
  switch (m) {
    case Mutant::none: return "none";
#define KVLAYER_MUTANT_SITE(name)
#define KVLAYER_MUTANT(name, expect, sites, description) \
  case Mutant::name: return #name;
#include "mutants.def"
#undef KVLAYER_MUTANT
#undef KVLAYER_MUTANT_SITE
    case Mutant::count: break;
  }
  return "?";
}

const char* mutant_site_name(MutantSite s) {
  switch (s) {
#define KVLAYER_MUTANT_SITE(name) \
  case MutantSite::name: return #name;
#define KVLAYER_MUTANT(name, expect, sites, description)
#include "mutants.def"
#undef KVLAYER_MUTANT
#undef KVLAYER_MUTANT_SITE
    case MutantSite::count: break;
  }
  return "?";
}

Mutant active_mutant() {
#ifdef KVLAYER_MUTANTS
  static const Mutant armed = [] {
    const char* env = std::getenv("KVLAYER_MUTANT");
    if (env == nullptr || *env == '\0') return Mutant::none;
    std::string names;
    for (int i = 0; i < int(Mutant::count); ++i) {
      if (mutant_name(Mutant(i)) == std::string(env)) return Mutant(i);
      names += (i ? ", " : "") + std::string(mutant_name(Mutant(i)));
    }
    throw Error(ErrorKind::refused,
                std::string("KVLAYER_MUTANT: unknown mutant '") + env + "' (known: " + names + ")");
  }();
  return armed;
#else
  return Mutant::none;
#endif
}

#ifdef KVLAYER_MUTANTS
namespace {

std::atomic<unsigned> host_reach{0};

/// Prints the reach line when destroyed at process exit.
/// NOTE: constructed after the CUDA runtime's first calls (in arm_device_mutants), so it is
/// destroyed before the runtime tears down, while the device masks can still be read.
struct ReachReport {
  ~ReachReport() {
    unsigned sites = host_reach.load();
    std::string failed;
    // Work still queued may set bits; errors are reported, not thrown (exit time).
    if (const cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess)
      failed = std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(err);
#define KVLAYER_READ_MUTANT_UNIT(unit)                                         \
  if (unsigned s = 0; failed.empty()) {                                        \
    if (const cudaError_t err = unit##_mutant_reach(&s); err == cudaSuccess)   \
      sites |= s;                                                              \
    else                                                                       \
      failed = std::string(#unit "_mutant_reach: ") + cudaGetErrorString(err); \
  }
    KVLAYER_MUTANT_UNITS(KVLAYER_READ_MUTANT_UNIT)
#undef KVLAYER_READ_MUTANT_UNIT
    std::string line;
    for (int i = 0; i < int(MutantSite::count); ++i)
      if ((sites >> i) & 1u)
        line += (line.empty() ? "" : ", ") + std::string(mutant_site_name(MutantSite(i)));
    if (line.empty()) line = "nothing";
    if (!failed.empty()) line += " (device masks unread: " + failed + ")";
    std::fprintf(stderr, "mutant %s reached: %s\n", mutant_name(active_mutant()), line.c_str());
  }
};

}  // namespace

bool host_mutant(Mutant m) {
  if (active_mutant() != m) return false;
  host_reach.fetch_or(1u << static_cast<int>(MutantSite::host));
  return true;
}

float default_scale_mutant(float s) {
  if (active_mutant() != Mutant::default_scale_f16) return s;
  const float h = f16_bits_to_f32(f32_to_f16_bits(s));  // planted bug
  if (h != s) host_reach.fetch_or(1u << static_cast<int>(MutantSite::host));
  return h;
}
#endif

#ifdef KVLAYER_MUTANTS
namespace {

/// Whether KVLAYER_MUTANT_UNITS (kernel translation units, comma-separated; unset or empty: all)
/// arms `unit`, so that tools/mutants can prove a mutant planted in several kernels is caught in
/// each. Throws kvlayer::Error for a name that is not a unit.
bool unit_armed(const char* unit) {
  const char* env = std::getenv("KVLAYER_MUTANT_UNITS");
  if (env == nullptr || *env == '\0') return true;
  static const char* const kUnits[] = {
#define KVLAYER_UNIT_NAME(unit) #unit,
      KVLAYER_MUTANT_UNITS(KVLAYER_UNIT_NAME)
#undef KVLAYER_UNIT_NAME
  };
  bool armed = false;
  const std::string list(env);
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    bool known = false;
    for (const char* u : kUnits) known = known || name == u;
    if (!known) {
      std::string names;
      for (const char* u : kUnits) names += (names.empty() ? "" : ", ") + std::string(u);
      throw Error(ErrorKind::refused,
                  "KVLAYER_MUTANT_UNITS: unknown unit '" + name + "' (known: " + names + ")");
    }
    armed = armed || name == unit;
    at = end + 1;
  }
  return armed;
}

}  // namespace
#endif

void arm_device_mutants() {
#ifdef KVLAYER_MUTANTS
  static std::once_flag once;
  std::call_once(once, [] {
    const int m = static_cast<int>(active_mutant());
#define KVLAYER_ARM_MUTANT_UNIT(unit) \
  KVLAYER_CUDA_TRY(unit##_arm_mutant(unit_armed(#unit) ? m : 0));
    KVLAYER_MUTANT_UNITS(KVLAYER_ARM_MUTANT_UNIT)
#undef KVLAYER_ARM_MUTANT_UNIT
    if (m != 0) static ReachReport report;
  });
#endif
}

}  // namespace kvlayer::cuda::detail
