// The committed golden data, loaded once per test process.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kvlayer/golden/golden.hpp"

namespace kvlayer::testing {

/// The golden set from the source tree, or nullptr (with load_error() set) if it cannot load.
const kvlayer::golden::GoldenSet* golden_set();
/// Why golden_set() returned nullptr.
const std::string& load_error();

/// The names of a list of golden cases (each has a `name`), for a parameterized suite.
template <class Case>
std::vector<std::string> case_names(const std::vector<Case>& cases) {
  std::vector<std::string> out;
  for (const Case& c : cases) out.push_back(c.name);
  return out;
}

/// The case called `name`; throws naming the list (`what`) when there is none.
template <class Case>
const Case& find_named(const std::vector<Case>& cases, const std::string& name, const char* what) {
  for (const Case& c : cases)
    if (c.name == name) return c;
  throw std::runtime_error(std::string("no golden ") + what + " case " + name);
}

/// A check's failure lines, one per line, indented under the assertion that prints them.
inline std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

}  // namespace kvlayer::testing
