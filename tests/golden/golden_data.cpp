#include "golden_data.hpp"

#include "kvlayer/error.hpp"

namespace kvlayer::testing {
namespace {
struct Loaded {
  std::unique_ptr<kvlayer::golden::GoldenSet> set;
  std::string error;
};
const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    try {
      r.set = std::make_unique<kvlayer::golden::GoldenSet>(
          kvlayer::golden::load_golden(kvlayer::golden::default_golden_dir()));
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    return r;
  }();
  return l;
}
}  // namespace

const kvlayer::golden::GoldenSet* golden_set() {
  return loaded().set.get();
}
const std::string& load_error() {
  return loaded().error;
}

}  // namespace kvlayer::testing
