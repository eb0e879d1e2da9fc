// The main of every GPU test binary (linked by kvlayer_gpu_test). Exit status: 77 when no test
// failed and at least one was skipped, so that ctest (SKIP_RETURN_CODE 77) reports Skipped from
// the exit status alone; a failure anywhere keeps GoogleTest's failing status. A skip must not
// read as a pass, and a skip marker in the output must not hide a failure (which a
// SKIP_REGULAR_EXPRESSION would do whatever the exit code).
#include <gtest/gtest.h>

#include <cstdio>

#include "kvlayer/testing/gpu.hpp"

namespace {

constexpr int kExitSkipped = 77;

/// Prints the run's bound tightness line (when a test recorded any) for tools/device-check.
class BoundTightnessReport : public ::testing::Environment {
 public:
  void TearDown() override {
    const auto& t = kvlayer::testing::bound_tightness();
    if (t.elements() > 0) std::printf("%s\n", t.summary().c_str());
    const auto& s = kvlayer::testing::systematic_check();
    if (s.launches() > 0) std::printf("%s\n", s.summary().c_str());
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new BoundTightnessReport);  // owned by GoogleTest
  const int status = RUN_ALL_TESTS();
  if (status != 0) return status;
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (u.failed_test_count() == 0 && u.skipped_test_count() > 0) return kExitSkipped;
  return 0;
}
