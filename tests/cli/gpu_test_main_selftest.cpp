// Tests for the shared GPU test main, run by check_gpu_test_main.cmake with one --gtest_filter
// per case. The failing tests fail only when KVLAYER_MAIN_SELFTEST_FAIL is set, so that a plain
// run of this binary does not read as a broken build.
#include <gtest/gtest.h>

#include <cstdlib>

#include "kvlayer/testing/gpu.hpp"

namespace {

bool failing_wanted() {
  return std::getenv("KVLAYER_MAIN_SELFTEST_FAIL") != nullptr;
}

TEST(MainSelfTest, Passes) {
  SUCCEED();
}

TEST(MainSelfTest, Skips) {
  GTEST_SKIP() << "skipped on purpose";
}

TEST(MainSelfTest, Fails) {
  if (!failing_wanted()) GTEST_SKIP() << "KVLAYER_MAIN_SELFTEST_FAIL is not set";
  ADD_FAILURE() << "failed on purpose";
}

TEST(MainSelfTest, FailsThenSkips) {
  if (!failing_wanted()) GTEST_SKIP() << "KVLAYER_MAIN_SELFTEST_FAIL is not set";
  ADD_FAILURE() << "failed on purpose";
  GTEST_SKIP() << "a skip after a failure";
}

TEST(MainSelfTest, RecordsTightness) {
  // got 0.5 against õ 0 and bound 1 (exact-q term 0), convex reach 4: one element, not
  // vacuous, resolution 0.5; and one skipped (NaN reference).
  kvlayer::ref::DecodeBound b{{1.0}, {0.0}, {4.0}, {0.0}, {4.0}};
  kvlayer::testing::bound_tightness().record(0.5, b, 0);
  kvlayer::testing::bound_tightness().skip();
}

}  // namespace
