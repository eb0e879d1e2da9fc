// libFuzzer target: the replay-file parser (kvlayer replay FILE). Any input must either parse
// into a case that round-trips through to_json, or be refused with kvlayer::Error — never
// crash, hang, leak or hit undefined behaviour (built with ASan + UBSan).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kvlayer/error.hpp"
#include "kvlayer/harness/replay_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvlayer;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  harness::Case c;
  try {
    c = harness::from_json(text);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::io) std::abort();  // malformed input is an I/O-class error
    return 0;
  }
  // A parsed case must survive a round trip unchanged.
  const std::string once = harness::to_json(c);
  if (harness::to_json(harness::from_json(once)) != once) std::abort();
  return 0;
}
