// Planted mutants: known bugs compiled into the CUDA layer only when KVLAYER_MUTANTS=ON (off by
// default), so that the model-based harness can prove it catches each one (tools/mutants).
// One mutant at a time is armed at run time by KVLAYER_MUTANT=<name>.
#pragma once

#include <cuda_runtime_api.h>

namespace kvlayer::cuda::detail {

enum class Mutant : int {
  none = 0,
  fast_math_quantization,  ///< approximate division and reciprocal in the quantizers
  q5_1_fma,                ///< q5_1 quant as one fused multiply-add
  qh_bit_order,            ///< q5_1 qh bits stored in reverse order
  rebase_off_by_one,       ///< the rebase moves one kept row too few
  rewind_forgets_len_d,    ///< rewind updates len but not len_d
  base_d_not_updated,      ///< a rebase updates base but not base_d
  decode_window_off_by_one,  ///< windowed decode attends one key too few
  split_drops_last_key,    ///< every decode split drops its last key
  count
};

/// The mutant's name as KVLAYER_MUTANT spells it.
const char* mutant_name(Mutant m);

/// The mutant armed in this process: none unless built with KVLAYER_MUTANTS and KVLAYER_MUTANT
/// names one (an unknown name throws kvlayer::Error listing the names).
Mutant active_mutant();

/// Copies the armed mutant to every kernel translation unit (once per process; no-op in
/// normal builds). Called by KvLayer's constructor.
void arm_device_mutants();

#ifdef KVLAYER_MUTANTS
// One setter per kernel translation unit (each has its own __constant__ copy).
cudaError_t set_append_mutant(int m);
cudaError_t set_decode_mutant(int m);
cudaError_t set_decode_mma_mutant(int m);
#endif

}  // namespace kvlayer::cuda::detail

/// True on the host when mutant `name` is armed (always false in normal builds).
#ifdef KVLAYER_MUTANTS
#define KVLAYER_HOST_MUTANT(name) \
  (::kvlayer::cuda::detail::active_mutant() == ::kvlayer::cuda::detail::Mutant::name)
#else
#define KVLAYER_HOST_MUTANT(name) false
#endif
