// kvlayer: command-line entry point. Dispatches to the subcommands of the table below.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvlayer/error.hpp"

namespace kvlayer::cli {
namespace {

/// Every subcommand, in the order `kvlayer --help` lists them.
using CommandFactory = const Command& (*)();
constexpr CommandFactory kCommands[] = {
    &quantize_command,       &dequantize_command, &selfcheck_command,     &fuzz_command,
    &replay_command,         &inspect_command,    &snapshot_demo_command, &sensitivity_command,
#ifdef KVLAYER_WITH_CUDA
    &bench_command,          &soak_command,       &probe_command,         &mma_probe_command,
    &snapshot_bench_command,
#endif
};

std::string command_list() {
  std::string s;
  for (CommandFactory f : kCommands) s += (s.empty() ? "" : ", ") + std::string(f().name);
  return s;
}

void print_help(std::ostream& out) {
  out << "kvlayer - quantized attention KV cache (q8_0 keys, q5_1 values) tools\n\n"
         "usage: kvlayer <command> [options]\n"
         "       kvlayer <command> --help    details of one command\n\n"
         "commands:\n";
  for (CommandFactory f : kCommands) {
    const Command& c = f();
    out << "  " << c.name
        << std::string(std::max<std::size_t>(2, 16 - std::min<std::size_t>(16, c.name.size())), ' ')
        << c.summary << "\n";
  }
  out << "\nexit status: 0 success, 1 data/I-O error or failed check, 2 usage error\n";
}

}  // namespace

Options::Options(const std::vector<std::string>& args, const std::vector<std::string>& valued,
                 const std::vector<std::string>& flags) {
  auto known = [](const std::vector<std::string>& list, const std::string& n) {
    return std::find(list.begin(), list.end(), n) != list.end();
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      throw UsageError("unexpected argument '" + a + "' (options take the form --name value)");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (known(valued, name)) {
      if (!inline_value) {
        if (i + 1 >= args.size()) throw UsageError("option --" + name + " needs a value");
        value = args[++i];
      }
      if (values_.count(name)) throw UsageError("option --" + name + " given twice");
      values_[name] = value;
    } else if (known(flags, name) && !inline_value) {
      flags_.push_back(name);
    } else {
      std::string list;
      for (const auto& n : valued) list += (list.empty() ? "--" : ", --") + n;
      for (const auto& n : flags) list += (list.empty() ? "--" : ", --") + n;
      throw UsageError("unknown option '" + a + "' (options: " + list + ", --help)");
    }
  }
}

std::int64_t Options::integer(const std::string& name, std::int64_t fallback, std::int64_t lo,
                              std::int64_t hi) const {
  const auto v = get(name);
  if (!v) return fallback;
  std::size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(*v, &used);
  } catch (const std::exception&) {
    used = 0;  // not a number, or out of long long's range
  }
  if (used != v->size() || x < lo || x > hi)
    throw UsageError("--" + name + " '" + *v + "' must be an integer in [" + std::to_string(lo) +
                     ", " + std::to_string(hi) + "]");
  return x;
}

std::optional<std::string> Options::get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Options::require(const std::string& name, std::string_view usage_line) const {
  if (auto v = get(name)) return *v;
  throw UsageError("missing --" + name + " (usage: " + std::string(usage_line) + ")");
}

bool Options::flag(const std::string& name) const {
  return std::find(flags_.begin(), flags_.end(), name) != flags_.end();
}

}  // namespace kvlayer::cli

int main(int argc, char** argv) {
  using namespace kvlayer::cli;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_help(std::cerr);
    return kExitUsage;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_help(std::cout);
    return kExitOk;
  }
  const Command* cmd = nullptr;
  for (CommandFactory f : kCommands)
    if (f().name == args[0]) cmd = &f();
  if (cmd == nullptr) {
    std::cerr << "kvlayer: unknown command '" << args[0] << "' (commands: " << command_list()
              << "; see kvlayer --help)\n";
    return kExitUsage;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (std::find(rest.begin(), rest.end(), "--help") != rest.end() ||
      std::find(rest.begin(), rest.end(), "-h") != rest.end()) {
    std::cout << cmd->usage;
    return kExitOk;
  }
  const std::string prefix = "kvlayer " + std::string(cmd->name) + ": ";
  try {
    return cmd->run(rest);
  } catch (const UsageError& e) {
    std::cerr << prefix << e.what() << "\n";
    return kExitUsage;
  } catch (const kvlayer::Error& e) {
    std::cerr << prefix << e.what() << "\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << prefix << "internal error: " << e.what() << "\n";
    return kExitFailure;
  }
}
