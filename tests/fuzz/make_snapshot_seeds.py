#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_snapshot_file (tests/fuzz/corpus/snapshot/): small snapshot
files (flat, windowed flat, ring, empty) written by gguf-py's GGUFWriter with seeded block bytes
and their CRC-32s, and two broken ones (truncated, GGUF version 2). Deterministic; re-run it
after a change of the file format:  python3 tests/fuzz/make_snapshot_seeds.py
"""

import os
import zlib

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "snapshot")


def write(name, heads, hd, max_ctx, length, first, base, window=None, ring=None):
    rs = np.random.RandomState(len(name))
    rows = length - first
    k = rs.randint(0, 256, (rows, heads * hd // 32 * 34)).astype(np.uint8)
    v = rs.randint(0, 256, (rows, heads * hd // 32 * 24)).astype(np.uint8)
    path = os.path.join(HERE, name)
    w = GGUFWriter(path, "kvlayer")
    w.add_custom_alignment(32)
    w.add_uint32("kvlayer.format_version", 1)
    w.add_uint32("kvlayer.n_kv_heads", heads)
    w.add_uint32("kvlayer.head_dim_k", hd)
    w.add_uint32("kvlayer.head_dim_v", hd)
    w.add_uint64("kvlayer.max_ctx", max_ctx)
    if window is not None:
        w.add_uint64("kvlayer.window", window)
    w.add_string("kvlayer.storage", "ring" if ring else "flat")
    w.add_uint64("kvlayer.max_append", ring[0] if ring else 1)
    w.add_uint64("kvlayer.rewind_slack", ring[1] if ring else 0)
    w.add_uint64("kvlayer.len", length)
    w.add_uint64("kvlayer.first", first)
    w.add_uint64("kvlayer.base", base)
    w.add_uint32("kvlayer.k_crc32", zlib.crc32(k.tobytes()))
    w.add_uint32("kvlayer.v_crc32", zlib.crc32(v.tobytes()))
    w.add_tensor("kv.k", k, raw_shape=k.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("kv.v", v, raw_shape=v.shape, raw_dtype=GGMLQuantizationType.Q5_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        return f.read()


def main():
    os.makedirs(HERE, exist_ok=True)
    write("flat.gguf", 1, 32, 8, 3, 0, 0)
    write("flat_window.gguf", 2, 32, 20, 5, 0, 0, window=2)
    ring = write("ring.gguf", 1, 32, 100, 40, 32, 32, window=3, ring=(2, 1))
    write("empty.gguf", 1, 64, 4, 0, 0, 0, window=1, ring=(1, 0))
    with open(os.path.join(HERE, "truncated.gguf"), "wb") as f:
        f.write(ring[: len(ring) // 2])
    with open(os.path.join(HERE, "version2.gguf"), "wb") as f:
        f.write(ring[:4] + bytes([2, 0, 0, 0]) + ring[8:])


if __name__ == "__main__":
    main()
