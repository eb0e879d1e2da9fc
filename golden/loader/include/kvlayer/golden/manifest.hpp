// golden/data/manifest.json read with nlohmann_json, behind checked accessors: a malformed
// manifest ends in a kvlayer::Error (io) that names what was expected, never in a nlohmann
// exception or a silently truncated number.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kvlayer::golden {

/// Document order kept: the loader lists a case's formats in the order the manifest gives.
using Json = nlohmann::ordered_json;

/// Parses a complete JSON text; a syntax error throws "json: <what> at byte <offset>".
Json parse_json(std::string_view text);

/// Member `key` of an object; throws "json: missing key "<key>"" (or, when `object` is not an
/// object, the type error below).
const Json& member(const Json& object, std::string_view key);
/// True iff `object` is an object holding `key`.
bool has_member(const Json& object, std::string_view key);

// The value as one type; each throws "json: expected a <type>, found a <type>".
bool as_bool(const Json& v);
double as_number(const Json& v);
/// The number as an integer; throws "json: <number> is not an integer" unless it is integral
/// and within ±2^53.
std::int64_t as_int(const Json& v);
const std::string& as_string(const Json& v);
const Json::array_t& as_array(const Json& v);
const Json::object_t& as_object(const Json& v);

}  // namespace kvlayer::golden
