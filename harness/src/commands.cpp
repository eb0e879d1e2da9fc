#include "kvlayer/harness/commands.hpp"

#include <charconv>
#include <optional>
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
    case DataKind::needles:
      return "needles";
  }
  return "?";
}

std::string decode_variant_name(DecodeVariant variant) {
  return std::string(name_of(Decode{variant, 0}));
}

std::string verify_variant_name(DecodeVariant variant) {
  return variant == DecodeVariant::host ? "decode_rows"
         : variant == DecodeVariant::dc ? "decode_rows_dc"
                                        : "decode_rows_dcw";
}

namespace {

/// Writes a command's fields as its line shows them: " key=value", the seed last.
class LineFields {
 public:
  explicit LineFields(std::ostream& s) : s_(s) {}
  void count(const char* key, std::int64_t v, std::int64_t = 0, std::int64_t = 0) {
    s_ << ' ' << key << '=' << v;
  }
  void range(const char*, const char*, std::int64_t start, std::int64_t end) {
    s_ << " [" << start << ", " << end << ')';
  }
  void data(DataKind kind) { s_ << " data=" << data_kind_name(kind); }
  void seed(std::uint64_t seed) { seed_ = seed; }
  void flag(const char*, bool v, const char* on, const char* off) { s_ << ' ' << (v ? on : off); }
  void scale(std::optional<float> v) {
    if (!v) return;
    // The shortest text that reads back as the same float: the line names the exact scale.
    char text[32];
    const auto r = std::to_chars(text, text + sizeof text, *v);
    s_ << " scale=" << std::string_view(text, std::size_t(r.ptr - text));
  }
  void finish() {
    if (seed_) s_ << " seed=" << *seed_;
  }

 private:
  std::ostream& s_;
  std::optional<std::uint64_t> seed_;
};

}  // namespace

std::string describe(const Command& command) {
  std::ostringstream s;
  std::visit(
      [&]<typename C>(const C& c) {
        s << name_of(c);
        LineFields fields(s);
        C::fields(c, fields);
        fields.finish();
      },
      command);
  return s.str();
}

std::string kind_name(const Command& command) {
  return std::string(std::visit([](const auto& c) { return name_of(c); }, command));
}

}  // namespace kvlayer::harness
