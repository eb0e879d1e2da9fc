// A small JSON reader, enough for golden/data/manifest.json (objects, arrays, strings with the
// usual escapes, numbers, true/false/null). No dependency beyond the standard library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvlayer::golden {

/// One parsed JSON value. Accessors throw kvlayer::Error (io) naming the expected type.
class Json {
 public:
  enum class Type { null, boolean, number, string, array, object };

  /// Parses a complete JSON text; throws kvlayer::Error (io) with the byte offset on bad input.
  static Json parse(std::string_view text);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool as_bool() const;
  double as_number() const;
  /// The number as an integer; throws unless it is integral and fits in int64.
  std::int64_t as_int() const;
  const std::string& as_string() const;
  const std::vector<Json>& as_array() const;
  /// Object members in document order.
  const std::vector<std::pair<std::string, Json>>& as_object() const;
  /// Member `key` of an object; throws if this is not an object or the key is missing.
  const Json& operator[](std::string_view key) const;
  /// True iff this is an object holding `key`.
  bool contains(std::string_view key) const;

 private:
  friend class JsonParser;
  Type type_ = Type::null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Json> array_;
  std::vector<std::pair<std::string, Json>> object_;
};

}  // namespace kvlayer::golden
