#include "kvlayer/golden/json.hpp"

#include <cmath>
#include <cstdlib>

#include "kvlayer/error.hpp"

namespace kvlayer::golden {

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  Json document() {
    Json v = value(0);
    skip_ws();
    if (pos_ != text_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;  // the manifest nests 5 deep; this only stops runaways

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorKind::io, "json: " + what + " at byte " + std::to_string(pos_));
  }
  void skip_ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= text_.size()) fail("unexpected end of input");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    Json v;
    const char c = peek();
    if (c == '{') {
      v.type_ = Json::Type::object;
      ++pos_;
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      for (;;) {
        if (peek() != '"') fail("expected a string key");
        std::string key = string();
        expect(':');
        v.object_.emplace_back(std::move(key), value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type_ = Json::Type::array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      for (;;) {
        v.array_.push_back(value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type_ = Json::Type::string;
      v.string_ = string();
      return v;
    }
    if (literal("true") || literal("false")) {
      v.type_ = Json::Type::boolean;
      v.bool_ = text_[pos_ - 4] == 't';  // "true" ends 4 bytes back; "false" holds 'a' there
      return v;
    }
    if (literal("null")) return v;
    return number();
  }

  Json number() {
    const std::size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() &&
           std::string_view("0123456789.eE+-").find(text_[pos_]) != std::string_view::npos)
      ++pos_;
    const std::string token(text_.substr(start, pos_ - start));
    if (token.empty() || token == "-") fail("unexpected character");
    char* end = nullptr;
    const double d = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size()) fail("malformed number '" + token + "'");
    Json v;
    v.type_ = Json::Type::number;
    v.number_ = d;
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          if (pos_ + 4 > text_.size()) fail("short \\u escape");
          const unsigned cp =
              unsigned(std::strtoul(std::string(text_.substr(pos_, 4)).c_str(), nullptr, 16));
          pos_ += 4;
          // The manifest is ASCII (json.dump's default); encode the BMP as UTF-8 for the rest.
          if (cp < 0x80) {
            out += char(cp);
          } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
          } else {
            out += char(0xE0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:
          fail(std::string("unknown escape \\") + e);
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

Json Json::parse(std::string_view text) {
  return JsonParser(text).document();
}

namespace {
const char* type_name(Json::Type t) {
  switch (t) {
    case Json::Type::null:
      return "null";
    case Json::Type::boolean:
      return "boolean";
    case Json::Type::number:
      return "number";
    case Json::Type::string:
      return "string";
    case Json::Type::array:
      return "array";
    case Json::Type::object:
      return "object";
  }
  return "?";
}
[[noreturn]] void wrong_type(Json::Type want, Json::Type got) {
  throw Error(ErrorKind::io,
              std::string("json: expected a ") + type_name(want) + ", found a " + type_name(got));
}
}  // namespace

bool Json::as_bool() const {
  if (type_ != Type::boolean) wrong_type(Type::boolean, type_);
  return bool_;
}
double Json::as_number() const {
  if (type_ != Type::number) wrong_type(Type::number, type_);
  return number_;
}
std::int64_t Json::as_int() const {
  const double d = as_number();
  if (d != std::floor(d) || std::fabs(d) > 9007199254740992.0)
    throw Error(ErrorKind::io, "json: " + std::to_string(d) + " is not an integer");
  return std::int64_t(d);
}
const std::string& Json::as_string() const {
  if (type_ != Type::string) wrong_type(Type::string, type_);
  return string_;
}
const std::vector<Json>& Json::as_array() const {
  if (type_ != Type::array) wrong_type(Type::array, type_);
  return array_;
}
const std::vector<std::pair<std::string, Json>>& Json::as_object() const {
  if (type_ != Type::object) wrong_type(Type::object, type_);
  return object_;
}
const Json& Json::operator[](std::string_view key) const {
  for (const auto& [k, v] : as_object())
    if (k == key) return v;
  throw Error(ErrorKind::io, "json: missing key \"" + std::string(key) + "\"");
}
bool Json::contains(std::string_view key) const {
  if (type_ != Type::object) return false;
  for (const auto& [k, v] : object_)
    if (k == key) return true;
  return false;
}

}  // namespace kvlayer::golden
