// DecodeOptions::from_environment: the one place the decode's environment variables are read
// (a layer's constructor takes its result by default; the planner reads no environment).
#include "kvlayer/cuda/decode_options.hpp"

#include <cstdlib>
#include <string>
#include <string_view>

#include "kvlayer/error.hpp"

namespace kvlayer::cuda {

const char* decode_kernel_name(DecodeOptions::Kernel kernel) {
  switch (kernel) {
    case DecodeOptions::Kernel::mma:
      return "mma";
    case DecodeOptions::Kernel::cuda_core:
      return "cuda_core";
  }
  return "?";
}

const char* decode_rows_name(DecodeOptions::Rows rows) {
  switch (rows) {
    case DecodeOptions::Rows::automatic:
      return "auto";
    case DecodeOptions::Rows::split:
      return "split";
    case DecodeOptions::Rows::whole:
      return "whole";
  }
  return "?";
}

const char* decode_verify_name(DecodeOptions::Verify verify) {
  switch (verify) {
    case DecodeOptions::Verify::mma:
      return "mma";
    case DecodeOptions::Verify::wgmma:
      return "wgmma";
  }
  return "?";
}

namespace {

/// The variable's value as an integer in [lo, hi], or `otherwise` when it is not set. The whole
/// value must be a number in range ("8x" or "" is refused, not read as 8 or 0).
int integer_from_environment(const char* name, int lo, int hi, int otherwise) {
  const char* env = std::getenv(name);
  if (env == nullptr) return otherwise;
  const std::string v(env);
  std::size_t used = 0;
  int value = lo - 1;
  try {
    value = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || value < lo || value > hi)
    refuse("DecodeOptions", name, "=", v, " is outside [", lo, ", ", hi, "]");
  return value;
}

}  // namespace

DecodeOptions DecodeOptions::from_environment() {
  const char* op = "DecodeOptions";
  DecodeOptions o;
  if (const char* env = std::getenv("KVLAYER_DECODE_KERNEL")) {
    const std::string_view v(env);
    if (v == "cuda_core")
      o.kernel = Kernel::cuda_core;
    else if (v != "mma")
      refuse(op, "KVLAYER_DECODE_KERNEL=", v,
             " is not a decode kernel (supported: mma, cuda_core)");
  }
  if (const char* env = std::getenv("KVLAYER_DECODE_ROWS")) {
    const std::string_view v(env);
    if (v == "split")
      o.rows = Rows::split;
    else if (v == "whole")
      o.rows = Rows::whole;
    else if (v != "auto")
      refuse(op, "KVLAYER_DECODE_ROWS=", v, " is not a row choice (supported: auto, split, whole)");
  }
  if (const char* env = std::getenv("KVLAYER_VERIFY_KERNEL")) {
    const std::string_view v(env);
    if (v == "wgmma")
      o.verify = Verify::wgmma;
    else if (v != "mma")
      refuse(op, "KVLAYER_VERIFY_KERNEL=", v, " is not a verify kernel (supported: mma, wgmma)");
  }
  o.split_balance =
      integer_from_environment("KVLAYER_SPLIT_BALANCE", 0, kMaxSplitBalance, o.split_balance);
  o.batch_waves = integer_from_environment("KVLAYER_BATCH_WAVES", 1, kMaxBatchWaves, o.batch_waves);
  return o;
}

}  // namespace kvlayer::cuda
