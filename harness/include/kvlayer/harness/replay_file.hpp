// Replay files: a case as small JSON (geometry, dtype, seeds, commands), written when a case
// fails and re-run by `kvlayer replay FILE` without rapidcheck.
#pragma once

#include <string>
#include <string_view>

#include "kvlayer/harness/commands.hpp"

namespace kvlayer::harness {

/// The JSON text of a case (stable key order, one command per line).
std::string to_json(const Case& c);

/// Parses a replay file's text. Throws kvlayer::Error (ErrorKind::io) naming the field and
/// what is wrong with it; the geometry is validated too.
Case from_json(std::string_view text);

/// Reads and parses a replay file; errors name the path.
Case read_replay_file(const std::string& path);
/// Writes a replay file; errors name the path.
void write_replay_file(const std::string& path, const Case& c);

}  // namespace kvlayer::harness
