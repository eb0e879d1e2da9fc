#include "kvlayer/golden/manifest.hpp"

#include <cmath>

#include "kvlayer/error.hpp"

namespace kvlayer::golden {
namespace {

constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorKind::io, "json: " + what);
}

[[noreturn]] void wrong_type(const char* want, const Json& got) {
  fail(std::string("expected a ") + want + ", found a " + got.type_name());
}

}  // namespace

Json parse_json(std::string_view text) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    // what(): "[json.exception.parse_error.N] parse error at line L, column C: <reason>";
    // e.byte counts the bytes read up to and including the offending one.
    const std::string what = e.what();
    const std::size_t colon = what.find(": ");
    const std::string reason = colon == std::string::npos ? what : what.substr(colon + 2);
    fail(reason + " at byte " + std::to_string(e.byte == 0 ? 0 : e.byte - 1));
  }
}

const Json& member(const Json& object, std::string_view key) {
  as_object(object);
  const auto it = object.find(key);
  if (it == object.end()) fail("missing key \"" + std::string(key) + "\"");
  return *it;
}

bool has_member(const Json& object, std::string_view key) {
  return object.is_object() && object.contains(key);
}

bool as_bool(const Json& v) {
  if (!v.is_boolean()) wrong_type("boolean", v);
  return v.get<bool>();
}

double as_number(const Json& v) {
  if (!v.is_number()) wrong_type("number", v);
  return v.get<double>();
}

std::int64_t as_int(const Json& v) {
  const double d = as_number(v);  // the limits of a JSON number read as a double
  if (std::fabs(d) <= kMaxExactInteger) {
    if (!v.is_number_float()) return v.get<std::int64_t>();
    if (d == std::floor(d)) return std::int64_t(d);
  }
  fail(std::to_string(d) + " is not an integer");
}

const std::string& as_string(const Json& v) {
  if (!v.is_string()) wrong_type("string", v);
  return v.get_ref<const std::string&>();
}

const Json::array_t& as_array(const Json& v) {
  if (!v.is_array()) wrong_type("array", v);
  return v.get_ref<const Json::array_t&>();
}

const Json::object_t& as_object(const Json& v) {
  if (!v.is_object()) wrong_type("object", v);
  return v.get_ref<const Json::object_t&>();
}

}  // namespace kvlayer::golden
