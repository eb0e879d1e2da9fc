#!/usr/bin/env python3
"""The snapshot file against gguf-py, both directions (SPEC §13).

1. kvlayer -> gguf-py: `kvlayer snapshot-demo --output` writes a file (ring and flat, several
   lengths, the empty one included); gguf-py's GGUFReader opens it, finds GGUF v3, the kvlayer.*
   metadata with its types, tensors kv.k (Q8_0) and kv.v (Q5_1) of ggml dims [kv_dim, len - first]
   whose bytes have the stored CRC-32s (zlib), and gguf.quants.dequantize gives, bit for bit, the
   values the reference's dequantizer gives (`kvlayer dequantize` on the same bytes).
2. gguf-py -> kvlayer: GGUFWriter writes a file from those bytes and metadata; kvlayer loads it
   (`kvlayer snapshot-demo --compare`: every field and byte equals the demo snapshot) and
   `kvlayer inspect` reports the same as for kvlayer's own file.
Plain python3 + assert; run by ctest (label golden) with --kvlayer pointing at the built CLI.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

KEYS = {  # key: (type, writer method)
    "kvlayer.format_version": (GGUFValueType.UINT32, "add_uint32"),
    "kvlayer.n_kv_heads": (GGUFValueType.UINT32, "add_uint32"),
    "kvlayer.head_dim_k": (GGUFValueType.UINT32, "add_uint32"),
    "kvlayer.head_dim_v": (GGUFValueType.UINT32, "add_uint32"),
    "kvlayer.max_ctx": (GGUFValueType.UINT64, "add_uint64"),
    "kvlayer.window": (GGUFValueType.UINT64, "add_uint64"),
    "kvlayer.storage": (GGUFValueType.STRING, "add_string"),
    "kvlayer.max_append": (GGUFValueType.UINT64, "add_uint64"),
    "kvlayer.rewind_slack": (GGUFValueType.UINT64, "add_uint64"),
    "kvlayer.len": (GGUFValueType.UINT64, "add_uint64"),
    "kvlayer.first": (GGUFValueType.UINT64, "add_uint64"),
    "kvlayer.base": (GGUFValueType.UINT64, "add_uint64"),
    "kvlayer.k_crc32": (GGUFValueType.UINT32, "add_uint32"),
    "kvlayer.v_crc32": (GGUFValueType.UINT32, "add_uint32"),
}
TENSORS = {"kv.k": (GGMLQuantizationType.Q8_0, "q8_0"), "kv.v": (GGMLQuantizationType.Q5_1, "q5_1")}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, "%s -> %d\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr)
    return r.stdout


def read_kvlayer_file(path, storage, length):
    """Checks what gguf-py sees in a kvlayer file; returns its metadata and raw tensor bytes."""
    r = GGUFReader(path)
    assert r.fields["GGUF.version"].contents() == 3
    assert r.fields["general.alignment"].contents() == 32
    assert r.fields["general.architecture"].contents() == "kvlayer"
    meta = {}
    for key, (vtype, _) in KEYS.items():
        if key == "kvlayer.window" and storage == "flat":
            assert key not in r.fields, "a flat demo layer has no window"
            continue
        f = r.fields[key]
        assert f.types == [vtype], "%s: %s, expected %s" % (key, f.types, vtype)
        meta[key] = f.contents()
    assert meta["kvlayer.storage"] == storage
    assert meta["kvlayer.len"] == length
    rows = meta["kvlayer.len"] - meta["kvlayer.first"]
    heads = meta["kvlayer.n_kv_heads"]
    dims = {"kv.k": heads * meta["kvlayer.head_dim_k"], "kv.v": heads * meta["kvlayer.head_dim_v"]}
    tensors = {t.name: t for t in r.tensors}
    assert sorted(tensors) == ["kv.k", "kv.v"]
    raw = {}
    for name, (qtype, _) in TENSORS.items():
        t = tensors[name]
        assert t.tensor_type == qtype, "%s: %s" % (name, t.tensor_type)
        assert list(t.shape) == [dims[name], rows], "%s: ggml dims %s" % (name, list(t.shape))
        assert t.data_offset % 32 == 0
        assert t.data.dtype == np.uint8 and t.data.shape[0] == rows, (t.data.dtype, t.data.shape)
        raw[name] = np.ascontiguousarray(t.data)
        crc = meta["kvlayer.k_crc32" if name == "kv.k" else "kvlayer.v_crc32"]
        assert zlib.crc32(raw[name].tobytes()) == crc, "%s: CRC-32 differs" % name
    return meta, raw, dims


def check_dequantization(kvlayer, tmp, raw, dims):
    """gguf-py's dequantization equals the reference's (kvlayer dequantize), bit for bit."""
    values = 0
    for name, (qtype, cli_type) in TENSORS.items():
        if raw[name].size == 0:
            continue  # nothing to compare (and gguf-py's Q5_1 dequantize fails on no blocks)
        theirs = dequantize(raw[name], qtype)
        assert theirs.shape == (raw[name].shape[0], dims[name]), theirs.shape
        blocks = os.path.join(tmp, name + ".bin")
        out = os.path.join(tmp, name + ".f32")
        raw[name].tofile(blocks)
        run([kvlayer, "dequantize", "--type", cli_type, "--input", blocks, "--output", out])
        ours = np.fromfile(out, dtype=np.float32).reshape(theirs.shape)
        assert np.isfinite(ours).all()
        diff = np.nonzero(ours.view(np.uint32) != theirs.astype(np.float32).view(np.uint32))
        assert diff[0].size == 0, "%s: %d values differ, first at %s: %r vs gguf %r" % (
            name, diff[0].size, (diff[0][0], diff[1][0]), ours[diff][0], theirs[diff][0])
        values += ours.size
    return values


def write_with_gguf_py(path, meta, raw):
    """The same snapshot written by gguf-py's GGUFWriter."""
    w = GGUFWriter(path, "kvlayer")
    w.add_custom_alignment(32)
    for key, (_, method) in KEYS.items():
        if key in meta:
            getattr(w, method)(key, meta[key])
    for name, (qtype, _) in TENSORS.items():
        w.add_tensor(name, raw[name], raw_shape=raw[name].shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv):
    ap = argparse.ArgumentParser(description="snapshot file vs gguf-py, both directions")
    ap.add_argument("--kvlayer", required=True, help="the built kvlayer CLI")
    args = ap.parse_args(argv)
    cases = [("ring", 300), ("ring", 1000), ("ring", 37), ("flat", 130), ("flat", 0)]
    identical_files = 0
    values = 0
    with tempfile.TemporaryDirectory() as tmp:
        for storage, length in cases:
            ours = os.path.join(tmp, "kvlayer-%s-%d.gguf" % (storage, length))
            theirs = os.path.join(tmp, "gguf-py-%s-%d.gguf" % (storage, length))
            demo = ["--storage", storage, "--len", str(length)]
            run([args.kvlayer, "snapshot-demo", "--output", ours] + demo)
            meta, raw, dims = read_kvlayer_file(ours, storage, length)
            values += check_dequantization(args.kvlayer, tmp, raw, dims)

            write_with_gguf_py(theirs, meta, raw)
            run([args.kvlayer, "snapshot-demo", "--compare", theirs] + demo)
            report_ours = run([args.kvlayer, "inspect", ours]).replace(ours, "FILE")
            report_theirs = run([args.kvlayer, "inspect", theirs]).replace(theirs, "FILE")
            # Only the file size may differ (gguf-py may order or pad differently).
            strip = lambda s: s.split("\n", 1)[1]  # noqa: E731
            assert strip(report_ours) == strip(report_theirs), report_ours + report_theirs
            with open(ours, "rb") as a, open(theirs, "rb") as b:
                identical_files += a.read() == b.read()
            print("  %s len %4d: gguf-py reads kvlayer's file (%d + %d tensor bytes), kvlayer "
                  "reads gguf-py's" % (storage, length, raw["kv.k"].size, raw["kv.v"].size))
    print("test_snapshot_gguf: %d cases, %d dequantized values bit-identical, both directions "
          "pass (%d of %d files byte-identical to gguf-py's)" % (
              len(cases), values, identical_files, len(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
