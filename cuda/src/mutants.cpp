#include "mutants.hpp"

#include <cstdlib>
#include <mutex>
#include <string>

#include "cuda_check.hpp"
#include "kvlayer/error.hpp"

namespace kvlayer::cuda::detail {

const char* mutant_name(Mutant m) {
  switch (m) {
    case Mutant::none: return "none";
    case Mutant::fast_math_quantization: return "fast_math_quantization";
    case Mutant::q5_1_fma: return "q5_1_fma";
    case Mutant::qh_bit_order: return "qh_bit_order";
    case Mutant::rebase_off_by_one: return "rebase_off_by_one";
    case Mutant::rewind_forgets_len_d: return "rewind_forgets_len_d";
    case Mutant::base_d_not_updated: return "base_d_not_updated";
    case Mutant::decode_window_off_by_one: return "decode_window_off_by_one";
    case Mutant::split_drops_last_key: return "split_drops_last_key";
    case Mutant::count: break;
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

void arm_device_mutants() {
#ifdef KVLAYER_MUTANTS
  static std::once_flag once;
  std::call_once(once, [] {
    const int m = static_cast<int>(active_mutant());
    KVLAYER_CUDA_TRY(set_append_mutant(m));
    KVLAYER_CUDA_TRY(set_decode_mutant(m));
    KVLAYER_CUDA_TRY(set_decode_mma_mutant(m));
  });
#endif
}

}  // namespace kvlayer::cuda::detail
