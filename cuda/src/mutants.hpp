// Planted mutants: known bugs compiled into the CUDA layer only when KVLAYER_MUTANTS=ON (off by
// default), so that the model-based harness can prove it catches each one (tools/mutants).
// One mutant at a time is armed at run time by KVLAYER_MUTANT=<name>. The list: mutants.def.
//
// Reach: every planted site records (device: a per-translation-unit bitmask, host: a static one)
// that its mutant changed what the code did, naming its site (kernel); at process exit one line
// `mutant NAME reached: site, site` (or `reached: nothing`) goes to stderr, so that a mutant
// that no campaign command ever exercised cannot pass for a caught one.
#pragma once

#include <cuda_runtime_api.h>

namespace kvlayer::cuda::detail {

enum class Mutant : int {
  none = 0,
#define KVLAYER_MUTANT_SITE(name)
#define KVLAYER_MUTANT(name, expect, sites, description) name,
#include "mutants.def"
#undef KVLAYER_MUTANT
#undef KVLAYER_MUTANT_SITE
  count
};

/// Where planted code runs: bit `site` of a reach mask.
enum class MutantSite : int {
#define KVLAYER_MUTANT_SITE(name) name,
#define KVLAYER_MUTANT(name, expect, sites, description)
#include "mutants.def"
#undef KVLAYER_MUTANT
#undef KVLAYER_MUTANT_SITE
  count
};
static_assert(static_cast<int>(MutantSite::count) <= 32, "a reach mask is 32 bits");

/// The mutant's name as KVLAYER_MUTANT spells it.
const char* mutant_name(Mutant m);

/// The site's name as the reach report spells it.
const char* mutant_site_name(MutantSite s);

/// The mutant armed in this process: none unless built with KVLAYER_MUTANTS and KVLAYER_MUTANT
/// names one (an unknown name throws kvlayer::Error listing the names).
Mutant active_mutant();

/// Copies the armed mutant to every kernel translation unit and, when one is armed, schedules
/// the reach report for process exit (once per process; no-op in normal builds). Called by
/// KvLayer's constructor.
void arm_device_mutants();

#ifdef KVLAYER_MUTANTS
/// True when m is armed; then records that the host site ran it.
bool host_mutant(Mutant m);

/// The layer's default decode scale s, or fp16(s) under default_scale_f16.
float default_scale_mutant(float s);

// One pair of hooks per kernel translation unit (each has its own __constant__ mutant and
// __device__ reach mask): arm it, read its reach mask.
#define KVLAYER_MUTANT_UNITS(X) \
  X(append)                     \
  X(decode_cuda_core)           \
  X(decode_mma_staged)          \
  X(decode_mma_direct) X(decode_mma_verify) X(decode_wgmma_verify) X(decode_merge) X(batch_schedule)
#define KVLAYER_DECLARE_MUTANT_UNIT(unit) \
  cudaError_t unit##_arm_mutant(int m);   \
  cudaError_t unit##_mutant_reach(unsigned* sites);
KVLAYER_MUTANT_UNITS(KVLAYER_DECLARE_MUTANT_UNIT)
#undef KVLAYER_DECLARE_MUTANT_UNIT
#else
inline float default_scale_mutant(float s) {
  return s;
}
#endif

}  // namespace kvlayer::cuda::detail

/// True on the host when mutant `name` is armed (always false in normal builds).
#ifdef KVLAYER_MUTANTS
#define KVLAYER_HOST_MUTANT(name) \
  ::kvlayer::cuda::detail::host_mutant(::kvlayer::cuda::detail::Mutant::name)
#else
#define KVLAYER_HOST_MUTANT(name) false
#endif
