// Test main for the reference properties. ctest runs every property with a fixed RC_PARAMS
// (seed and case count, see CMakeLists.txt); KVLAYER_RC_PARAMS in the environment replaces it at
// run time without reconfiguring (harness/README.md).
// NOTE: rapidcheck reads RC_PARAMS once, lazily, on the first property; setting it here, before
// RUN_ALL_TESTS, is early enough.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (const char* override_params = std::getenv("KVLAYER_RC_PARAMS"))
    setenv("RC_PARAMS", override_params, /*overwrite=*/1);
  if (const char* params = std::getenv("RC_PARAMS"))
    std::cout << "RC_PARAMS=\"" << params << "\"\n";
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
