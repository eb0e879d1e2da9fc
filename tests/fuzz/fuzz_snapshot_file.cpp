// libFuzzer target: the snapshot file reader (load_snapshot, kvlayer inspect). Any input must
// either be refused with kvlayer::Error (io) or parse into a snapshot that re-encodes and
// re-parses to the same fields and bytes, and (when its planes are small) restores into a
// reference layer whose snapshot holds the same rows — never crash, hang, leak, allocate beyond
// the input's size or hit undefined behaviour (built with ASan + UBSan).
// Seeds: tests/fuzz/corpus/snapshot/, written by tests/fuzz/make_snapshot_seeds.py.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "kvlayer/error.hpp"
#include "kvlayer/reference/kv_layer.hpp"
#include "kvlayer/snapshot_file.hpp"

namespace {

bool same(const kvlayer::Snapshot& a, const kvlayer::Snapshot& b) {
  return kvlayer::same_layout(a.geometry, b.geometry) &&
         a.geometry.max_append == b.geometry.max_append &&
         a.geometry.rewind_slack == b.geometry.rewind_slack && a.len == b.len &&
         a.first == b.first && a.base == b.base && a.k == b.k && a.v == b.v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvlayer;
  Snapshot s;
  try {
    s = parse_snapshot(std::span(data, size), "fuzz.gguf");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::io) std::abort();  // a bad file is an I/O-class error
    return 0;
  }
  // An accepted file is a valid snapshot: it encodes, and the encoding reads back the same.
  if (!same(parse_snapshot(encode_snapshot(s), "fuzz.gguf"), s)) std::abort();
  // Small enough to hold as a layer: the restore is accepted and keeps the rows.
  const Geometry& g = s.geometry;
  if (g.rows() * (g.k_tok_bytes() + g.v_tok_bytes()) <= (std::int64_t(1) << 24)) {
    ref::KvLayer layer(g);
    layer.restore(s);
    const Snapshot again = layer.snapshot();
    if (again.len != s.len || again.first != s.first || again.k != s.k || again.v != s.v)
      std::abort();
  }
  return 0;
}
