// Device side of the planted mutants (mutants.hpp): a per-translation-unit constant and the
// test macro. Include once per .cu that plants a mutant, then define its setter with
// KVLAYER_DEFINE_MUTANT_SETTER(name).
#pragma once

#include "mutants.hpp"

#if defined(KVLAYER_MUTANTS) && defined(__CUDACC__)
static __constant__ int kvlayer_device_mutant;
#define KVLAYER_DEVICE_MUTANT(name) \
  (kvlayer_device_mutant == static_cast<int>(::kvlayer::cuda::detail::Mutant::name))
#define KVLAYER_DEFINE_MUTANT_SETTER(fn)                                          \
  cudaError_t fn(int m) {                                                         \
    return cudaMemcpyToSymbol(kvlayer_device_mutant, &m, sizeof m);               \
  }
#else
#define KVLAYER_DEVICE_MUTANT(name) false
#define KVLAYER_DEFINE_MUTANT_SETTER(fn)
#endif
