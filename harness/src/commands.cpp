#include "kvlayer/harness/commands.hpp"

#include <sstream>

namespace kvlayer::harness {

std::string data_kind_name(DataKind kind) {
  switch (kind) {
    case DataKind::gaussian: return "gaussian";
    case DataKind::wide: return "wide";
    case DataKind::integers: return "integers";
    case DataKind::ties: return "ties";
    case DataKind::constant: return "constant";
    case DataKind::tiny: return "tiny";
    case DataKind::bad: return "bad";
  }
  return "?";
}

std::string decode_variant_name(DecodeVariant variant) {
  switch (variant) {
    case DecodeVariant::host: return "decode";
    case DecodeVariant::dc: return "decode_dc";
    case DecodeVariant::dcw: return "decode_dcw";
  }
  return "?";
}

namespace {
struct Describe {
  std::ostringstream& s;
  void operator()(const Append& c) {
    s << "append n=" << c.n << " data=" << data_kind_name(c.data) << " seed=" << c.seed;
  }
  void operator()(const AppendDc& c) {
    s << (c.windowed ? "append_dcw" : "append_dc") << " data=" << data_kind_name(c.data)
      << " seed=" << c.seed;
  }
  void operator()(const IncSeqlen&) { s << "inc_seqlen"; }
  void operator()(const AccountSteps& c) { s << "account_steps k=" << c.k; }
  void operator()(const Reserve& c) { s << "reserve k=" << c.k; }
  void operator()(const Rewind& c) { s << "rewind to=" << c.to; }
  void operator()(const Decode& c) { s << decode_variant_name(c.variant) << " seed=" << c.seed; }
  void operator()(const PhysicalRows& c) { s << "physical_rows [" << c.start << ", " << c.end << ")"; }
  void operator()(const CanRewindTo& c) { s << "can_rewind_to p=" << c.p; }
  void operator()(const GraphChain& c) {
    s << "graph_chain steps=" << c.steps << (c.windowed ? " dcw" : " dc") << " seed=" << c.seed;
  }
  void operator()(const StatusQuery&) { s << "status"; }
};
}  // namespace

std::string describe(const Command& command) {
  std::ostringstream s;
  std::visit(Describe{s}, command);
  return s.str();
}

std::string kind_name(const Command& command) {
  const std::string line = describe(command);
  return line.substr(0, line.find(' '));
}

}  // namespace kvlayer::harness
