// Device side of the planted mutants (mutants.hpp): per translation unit, the armed mutant
// (__constant__) and the reach mask (__device__), the test and reach macros. Include in every
// .cu that plants a mutant, then define its hooks once with KVLAYER_DEFINE_MUTANT_UNIT(unit)
// (unit as listed in KVLAYER_MUTANT_UNITS) inside namespace kvlayer::cuda::detail.
// Normal builds: the test is `false` and the reach mark evaluates nothing but its site.
#pragma once

#include "mutants.hpp"

#if defined(KVLAYER_MUTANTS) && defined(__CUDACC__)
static __constant__ int kvlayer_device_mutant;
static __device__ unsigned kvlayer_mutant_reach;

namespace kvlayer::cuda::detail {
/// Records that the armed mutant changed what `site` did (one atomic per site and launch, at
/// most: later marks see the bit already set).
__device__ __forceinline__ void mark_mutant_reached(MutantSite site) {
  const unsigned bit = 1u << static_cast<int>(site);
  if ((*static_cast<volatile unsigned*>(&kvlayer_mutant_reach) & bit) == 0u)
    atomicOr(&kvlayer_mutant_reach, bit);
}
}  // namespace kvlayer::cuda::detail

#define KVLAYER_DEVICE_MUTANT(name) \
  (kvlayer_device_mutant == static_cast<int>(::kvlayer::cuda::detail::Mutant::name))
#define KVLAYER_MUTANT_REACHED(site) ::kvlayer::cuda::detail::mark_mutant_reached(site)
#define KVLAYER_DEFINE_MUTANT_UNIT(unit)                                     \
  cudaError_t unit##_arm_mutant(int m) {                                     \
    return cudaMemcpyToSymbol(kvlayer_device_mutant, &m, sizeof m);          \
  }                                                                          \
  cudaError_t unit##_mutant_reach(unsigned* sites) {                         \
    return cudaMemcpyFromSymbol(sites, kvlayer_mutant_reach, sizeof *sites); \
  }
#else
#define KVLAYER_DEVICE_MUTANT(name) false
#define KVLAYER_MUTANT_REACHED(site) ((void)(site))
#define KVLAYER_DEFINE_MUTANT_UNIT(unit)
#endif
