// A Snapshot (snapshot.hpp) as a GGUF file (SPEC §13) that any GGUF reader opens (gguf-py,
// ggml): GGUF version 3, alignment 32 (general.alignment), general.architecture "kvlayer",
//   tensors  kv.k  Q8_0 (ggml type 8), ggml dims [kv_dim_k, len − first]
//            kv.v  Q5_1 (ggml type 7), ggml dims [kv_dim_v, len − first]
//            (numpy / gguf-py shape [rows, kv_dim]): the rows [first, len), as in the planes;
//   metadata kvlayer.format_version (uint32, 1), kvlayer.n_kv_heads, kvlayer.head_dim_k,
//            kvlayer.head_dim_v (uint32), kvlayer.max_ctx, kvlayer.window (uint64; absent
//            without a window), kvlayer.storage (string "flat" or "ring"), kvlayer.max_append,
//            kvlayer.rewind_slack, kvlayer.len, kvlayer.first, kvlayer.base (uint64),
//            kvlayer.k_crc32, kvlayer.v_crc32 (uint32: CRC-32 of each tensor's bytes, crc32.hpp).
// Other keys and tensors are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvlayer/snapshot.hpp"

namespace kvlayer {

/// The snapshot file's format version (kvlayer.format_version).
inline constexpr std::uint32_t kSnapshotFormatVersion = 1;

/// Writes `s` to `path` crash-safely: a temporary file in the same directory, written, fsynced,
/// renamed over `path`, then the directory fsynced. A writer killed at any point leaves `path`
/// as it was or complete with the new snapshot (it may leave its temporary file behind).
/// Refuses a malformed snapshot (validate_snapshot, operation "save_snapshot"); I/O failures
/// throw kvlayer::Error (io) "save_snapshot: <path>: <what>: <strerror>".
void save_snapshot(const std::string& path, const Snapshot& s);

/// Reads a snapshot file. Throws kvlayer::Error (io) "load_snapshot: <path>: <what>" naming the
/// field and the expected value when the file cannot be read, is not GGUF version 3, is
/// truncated, lacks a key or a tensor, holds a key of another type, a tensor of another type or
/// shape, fails a CRC, or describes a malformed snapshot (validate_snapshot's checks).
Snapshot load_snapshot(const std::string& path);

/// load_snapshot on bytes in memory, `name` standing for the path in messages (the libFuzzer
/// target and the tests use it).
Snapshot parse_snapshot(std::span<const std::uint8_t> file, const std::string& name);

/// The bytes save_snapshot writes for `s` (the whole file in memory). Refuses as save_snapshot.
std::vector<std::uint8_t> encode_snapshot(const Snapshot& s);

namespace detail {
/// TEST ONLY (tests/snapshot/test_snapshot_file.cpp): every later save stops once `bytes`
/// bytes of its temporary file are written, before any further step, as a writer killed there
/// would: the temporary file stays, the target is not touched, and save_snapshot throws
/// kvlayer::Error (io) "... stopped after N bytes (test crash point) ...". nullopt disarms.
/// Not thread-safe.
void set_save_crash_point(std::optional<std::uint64_t> bytes);
}  // namespace detail

}  // namespace kvlayer
