// Shared by every GPU test: skip visibly (GTEST_SKIP, reported by ctest as "Skipped") when no
// CUDA device is present, check CUDA calls, and sum the accuracy bound's tightness over the run
// (printed by the shared main, gpu_test_main.cpp).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/systematic_check.hpp"

namespace kvlayer::testing {

/// True when a CUDA device can be used by this process.
inline bool gpu_available() {
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
}

/// The process-wide tightness of the decode accuracy bound over every element a test compared
/// (record into it from the test thread). The shared gtest main prints its summary() line at
/// the end of the run when anything was recorded.
inline ref::BoundTightness& bound_tightness() {
  static ref::BoundTightness tightness;
  return tightness;
}

/// The process-wide statistical checks (issue #34) over every decode launch a test compared:
/// record each element, end_launch() after each launch; printed beside the above. Report only
/// here (a launch of several rows is one unit); the harness fails a case on the declared check.
inline ref::SystematicCheck& systematic_check() {
  static ref::SystematicCheck check;
  return check;
}

}  // namespace kvlayer::testing

/// Put first in every GPU test body (or fixture SetUp): skips with a visible reason.
#define KVLAYER_REQUIRE_GPU()                                                   \
  do {                                                                          \
    if (!::kvlayer::testing::gpu_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

/// Fails the current test on a CUDA error, naming the call.
#define KVLAYER_CUDA_CHECK(call)                                                           \
  do {                                                                                     \
    const cudaError_t kvlayer_err_ = (call);                                               \
    ASSERT_EQ(kvlayer_err_, cudaSuccess) << #call << ": " << cudaGetErrorString(kvlayer_err_); \
  } while (0)
