// kvlayer selfcheck: the reference against the committed golden data (golden/data), with a
// summary table. Exit 0 only if every case passes.
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "kvlayer/golden/check.hpp"
#include "kvlayer/golden/golden.hpp"

namespace kvlayer::cli {
namespace {

std::string fmt(const char* f, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

void row(const std::string& kind, const std::string& what, std::int64_t cases,
         const std::string& compared, std::int64_t mismatches, const std::string& detail,
         bool pass) {
  std::cout << fmt("%-7s %-9s %6lld  %-28s %10lld  %-6s  %s\n", kind.c_str(), what.c_str(),
                   (long long)cases, compared.c_str(), (long long)mismatches,
                   pass ? "PASS" : "FAIL", detail.c_str());
}

int run_selfcheck(const std::vector<std::string>& args) {
  const Options o(args, {"golden"}, {"verbose"});
  const std::filesystem::path dir = o.get("golden").value_or(golden::default_golden_dir().string());
  const bool verbose = o.flag("verbose");
  const golden::GoldenSet set = golden::load_golden(dir);  // throws (exit 1) on bad data

  std::cout << "kvlayer selfcheck: reference vs golden data in " << dir.string() << "\n"
            << "  manifest " << set.format << ": " << set.files_verified
            << " files, size/dtype/shape/sha256 verified\n\n";
  std::cout << fmt("%-7s %-9s %6s  %-28s %10s  %-6s  %s\n", "kind", "check", "cases", "compared",
                   "mismatches", "result", "detail");

  std::vector<std::string> failures;
  bool all_pass = true;

  for (ref::BlockType t : {ref::BlockType::q8_0, ref::BlockType::q5_1}) {
    const char* name = t == ref::BlockType::q8_0 ? "q8_0" : "q5_1";
    std::int64_t cases = 0, blocks = 0, mismatched = 0, bad = 0, misreported = 0, degenerate = 0;
    bool pass = true;
    for (const auto& c : set.quant)
      for (const auto& f : c.formats) {
        if (f.type != t) continue;
        const golden::QuantCheck r = golden::check_quant(c, f);
        ++cases;
        blocks += r.blocks;
        mismatched += r.mismatched_blocks;
        bad += r.bad_expected;
        misreported += r.bad_misreported;
        degenerate += r.degenerate;
        pass &= r.pass();
        failures.insert(failures.end(), r.failures.begin(), r.failures.end());
        if (verbose)
          std::cout << fmt("   %-24s %-5s %5lld blocks %4lld bad %4lld degenerate  %s\n",
                           c.name.c_str(), name, (long long)r.blocks, (long long)r.bad_expected,
                           (long long)r.degenerate, r.pass() ? "PASS" : "FAIL");
      }
    all_pass &= pass && cases > 0;
    row("quant", name, cases, fmt("%lld blocks", (long long)blocks), mismatched,
        fmt("%lld bad blocks (%lld misreported), %lld degenerate", (long long)bad,
            (long long)misreported, (long long)degenerate),
        pass && cases > 0);
  }

  std::int64_t ops = 0, decodes = 0, op_failures = 0, plane_bytes = 0, plane_mismatch = 0,
               outputs = 0, output_failures = 0, nans = 0;
  double max_err = 0, max_ratio = 0;
  bool planes_pass = true, out_pass = true;
  for (const auto& c : set.decode) {
    const golden::DecodeCheck r = golden::check_decode(c);
    ops += r.ops;
    decodes += r.decodes;
    op_failures += r.op_failures;
    plane_bytes += r.plane_bytes;
    plane_mismatch += r.plane_byte_mismatches;
    outputs += r.outputs_compared;
    output_failures += r.output_failures;
    nans += r.nan_outputs;
    max_err = std::max(max_err, r.max_abs_error);
    max_ratio = std::max(max_ratio, r.max_error_ratio);
    planes_pass &= r.plane_byte_mismatches == 0;
    out_pass &= r.output_failures == 0;
    all_pass &= r.pass();
    failures.insert(failures.end(), r.failures.begin(), r.failures.end());
    if (verbose)
      std::cout << fmt("   %-24s %3lld ops %6lld outputs  max |err| %.2e  err/bound %.3g  %s\n",
                       c.name.c_str(), (long long)r.ops, (long long)r.outputs_compared,
                       r.max_abs_error, r.max_error_ratio, r.pass() ? "PASS" : "FAIL");
  }
  const std::int64_t ncase = std::int64_t(set.decode.size());
  const bool ops_pass = op_failures == 0 && ncase > 0;
  row("decode", "state", ncase, fmt("%lld ops, %lld decodes", (long long)ops, (long long)decodes),
      op_failures, "len/base/refusals after every op, data error", ops_pass);
  row("decode", "planes", ncase, fmt("%lld bytes", (long long)plane_bytes), plane_mismatch,
      "final K and V planes, byte for byte", planes_pass && ncase > 0);
  row("decode", "outputs", ncase,
      fmt("%lld values (%lld NaN)", (long long)outputs, (long long)nans), output_failures,
      fmt("max |err| %.2e, max err/bound %.3g (bound: check.hpp)", max_err, max_ratio),
      out_pass && ncase > 0);
  all_pass &= ncase > 0 && !set.quant.empty();

  if (!failures.empty()) {
    std::cout << "\nfailures:\n";
    for (const auto& f : failures) std::cout << "  " << f << "\n";
  }
  std::cout << "\nresult: " << (all_pass ? "PASS" : "FAIL") << " ("
            << set.quant.size() + set.decode.size() << " cases)\n";
  return all_pass ? kExitOk : kExitFailure;
}

}  // namespace

const Command& selfcheck_command() {
  static const Command c{
      "selfcheck", "check the reference against the committed golden data",
      "usage: kvlayer selfcheck [--golden DIR] [--verbose]\n\n"
      "Loads DIR/manifest.json (default: the source tree's golden/data), verifies every file's\n"
      "sha256, dtype and shape, then replays every case on the CPU reference: quantized bytes bit\n"
      "for bit and bad-block reports; for decode cases the state and refusals after every\n"
      "operation, the final K/V planes byte for byte, the sticky data error, and every decode\n"
      "output within its derived float64 rounding bound. Prints a summary table (--verbose: one\n"
      "line per case).\n\n"
      "Exit status: 0 all checks pass, 1 a check failed or the data could not be read, 2 usage.\n",
      &run_selfcheck};
  return c;
}

}  // namespace kvlayer::cli
