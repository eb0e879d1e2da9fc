#!/usr/bin/env python3
"""batch_peers.py: the peers an engine would use for batched decode, timed on one GPU.

Batched single-token decode: B sequences, one query token each, every sequence over its own
cache of L_i keys, GQA. The rows are those of `kvlayer bench`'s batch rows (`batch_dc_graph`),
so that tools/bench-peers can put them side by side (its "Batch decode" table):

  geometry  8 KV heads x head dim 128, gqa 8 (64 query heads), fp16 queries
  4k        B = 8, 32, 128 sequences, every one at 4096 keys
  log       B = 8, 32, 128; sequence i (0-based) at L_i = round(256 * 2^(7 (i + 0.5) / B)) keys
            (rounded half up): log-uniform from 256 to 32K, deterministic (B = 8: 347, 636,
            1166, 2139, 3922, 7194, 13193, 24196)
  128k      B = 8, every sequence at 131072 keys (--batches values above 8 are left out)

Peers (names are <impl>_<kv dtype>):
  fi_cc_f16 / fi_cc_e4m3   FlashInfer 0.7.4 BatchDecodeWithPagedKVCacheWrapper, backend fa2,
                           use_tensor_cores=False (its CUDA-core decode kernel)
  fi_tc_f16 / fi_tc_e4m3   the same wrapper with use_tensor_cores=True (fa2 prefill kernel)
  xqa_f16 / xqa_e4m3       TensorRT-LLM's XQA as shipped in FlashInfer
                           (flashinfer.decode.xqa_batch_decode_with_kv_cache; e4m3 on SM90 = its
                           Hopper GMMA kernel)
  floor_q8q5               not a peer: peers.py's Triton streaming read of the q8_0 + q5_1 bytes
                           of the whole batch (sum L_i * 8 heads * 4 blocks * 58 B), graph-
                           replayed like the peers: the size-matched floor
As peers.py uses them: page size 32 (--page-size; the prebuilt XQA modules are for 32), NHD
layout, K and V as two tensors [pages, 32, 8, 128]; each sequence has its own pages
(kv_indptr / kv_indices / kv_last_page_len for FlashInfer, a [B, max pages] block table and
uint32 seq_lens for XQA; the pages of a sequence are consecutive, the sequences one after the
other). FlashInfer runs in CUDA-graph mode (use_cuda_graph=True, its index buffers fixed), plan()
once per row, outside the graph. fp8 caches are N(0, 1) values rounded to e4m3, scale 1.

What ../shared/peers/whl prebuilds (build_aot.py): the fa2 batch decode and batch prefill modules
for fp16 and e4m3 KV at head dim 128 and the XQA modules (page 32, gqa 8, head dim 128) for
fp16 and e4m3 KV. The device has no JIT: FLASHINFER_DISABLE_JIT is set unless --allow-jit, and
a peer whose module is not prebuilt gets a row with the reason (the script goes on; it stops
only on a CUDA error that outlives its call, keeping the JSON so far).

Method (peers.py's, whose Timer, reference, floor and env_info this script imports): each peer
is captured in one CUDA graph of >= 16 calls, each call on another copy of the batch's cache
(cold L2: the copies together exceed --rotate-mb; one copy is enough where it alone is >= 4x
the L2, and the copies of one cache stay under --max-copy-gb, so that the B = 128 log rows
(3.5 GB per fp16 copy) fit an 80 GB card), replayed 30 times; us per call = median replay /
calls. Each timed output (copy 0) is checked, for the first and the last sequence of the batch
(the shortest and the longest of a log row), against an fp32 attention on the same
(dequantized) values: max_abs_err in the JSON; > 10% of the reference's max abs is flagged
(ok false, suspect).

  python3 tools/batch_peers.py --json out.json [--budget-s 150] [--cases 4k,log,128k]
      [--batches 8,32,128] [--peers fi_tc_e4m3,xqa_e4m3,...] [--peers-dir .peers] [--allow-jit]
      [--dry-run]

On the device (through the device tool, from the repo root, carry [".peers"] = a copy of
../shared/peers, as ../shared/peers/README.md says; timeout_s 240; a full run takes
about a minute on an H100, the wheels' install included):

  P=.peers; rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site $P/whl/*.whl && PYTHONPATH=/tmp/site CUDA_HOME=/usr/local/cuda FLASHINFER_WORKSPACE_BASE=/tmp/fi TVM_FFI_CACHE_DIR=/tmp/tvmffi TRITON_CACHE_DIR=/tmp/triton timeout 200 python3 tools/batch_peers.py --peers-dir $P --budget-s 150 --json $OUT/batch_peers.json

then, with kvlayer bench's JSON of the same call: tools/bench-peers --kvlayer kvlayer.json
--batch-peers batch_peers.json --out DIR.
"""
import argparse
import functools
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # peer_common, also when this file is loaded by path
from peer_common import (add_run_args, cuda_torch, guarded, import_peers,  # noqa: E402
                         json_args, parse_peers, peer_impl, peer_kv, run_saved, short, within,
                         write_json)
N_KV_HEADS, HEAD_DIM, GQA = 8, 128, 8  # kvlayer bench's batch rows
N_Q_HEADS = N_KV_HEADS * GQA
CASES = ["4k", "log", "128k"]
FIXED_KEYS = {"4k": 4096, "128k": 131072}
MAX_BATCH = {"128k": 8}  # 128K keys x B: kvlayer bench times B = 8 only
DEFAULT_BATCHES = "8,32,128"
ALL_PEERS = ["fi_cc_f16", "fi_cc_e4m3", "fi_tc_f16", "fi_tc_e4m3", "xqa_f16", "xqa_e4m3",
             "floor_q8q5"]
KVLAYER_ROW = "batch_dc_graph"  # the name of kvlayer bench's rows that these stand beside
WORKSPACE_BYTES = 256 << 20  # per FlashInfer wrapper / XQA call (XQA: first 8 MB semaphores)
DEFAULT_L2_BYTES = 50 << 20  # H100 / H200; the GPU's own figure is used when torch has it
Q8Q5_BYTES_PER_BLOCK = 34 + 24  # a q8_0 K block + a q5_1 V block, per 32 values


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="write results here (JSON)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma list of 4k, log, 128k (default %(default)s)")
    ap.add_argument("--batches", default=DEFAULT_BATCHES,
                    help="the B values (default %(default)s; 128k takes those <= 8)")
    ap.add_argument("--peers", default="all", help=f"comma list of {','.join(ALL_PEERS)}, or all")
    ap.add_argument("--skip", default="", help="comma list of peer names to leave out")
    ap.add_argument("--peers-dir", default=None,
                    help="folder of peers.py (default: $KVLAYER_PEERS_DIR, .peers, ../shared/peers)")
    ap.add_argument("--page-size", type=int, default=32,
                    help="page size of the paged peers (the prebuilt XQA modules are for 32)")
    ap.add_argument("--rotate-mb", type=float, default=256.0,
                    help="cache copies per graph so that the bytes between two uses of one copy "
                         "exceed this (L2 is 50-60 MB)")
    ap.add_argument("--max-copy-gb", type=float, default=8.0,
                    help="cap on the memory of all copies of one cache (default %(default)s)")
    add_run_args(ap)
    ap.add_argument("--no-check", action="store_true", help="no fp32 reference checks")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU)")
    a = ap.parse_args(argv)
    a.case_list = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in a.case_list if c not in CASES]
    if bad or not a.case_list:
        ap.error(f"--cases '{a.cases}': known cases are {','.join(CASES)}")
    try:
        a.batch_list = [int(x) for x in a.batches.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--batches '{a.batches}' must be a comma list of integers")
    if not a.batch_list or any(b < 1 for b in a.batch_list):
        ap.error(f"--batches '{a.batches}' must list positive integers")
    a.peer_list = parse_peers(ap, a, ALL_PEERS, ALL_PEERS)
    if a.page_size < 1:
        ap.error("--page-size must be >= 1")
    return a


# ---------------------------------------------------------------------------------------
# rows, lengths, pages, bytes (no torch: tools/test_batch_peers.py checks these on the CPU)


def log_len(i, b):
    """Keys of sequence i (0-based) of a log row of b sequences: 256 * 2^(7 (i + 0.5) / b),
    rounded half up (as std::lround; no length of b = 2^k is a tie)."""
    return int(math.floor(256.0 * 2.0 ** (7.0 * (i + 0.5) / b) + 0.5))


def seq_lens(case, b):
    """[L_i] of the b sequences of a row."""
    if case == "log":
        return [log_len(i, b) for i in range(b)]
    return [FIXED_KEYS[case]] * b


def points(a):
    """(case, B) of every row, in kvlayer bench's order (cases, then B)."""
    return [(c, b) for c in a.case_list for b in a.batch_list if b <= MAX_BATCH.get(c, b)]


class Pages:
    """The page tables of one row: sequence i owns pages indptr[i] .. indptr[i + 1] - 1 (the
    sequences one after the other), its last page holds last[i] keys; table is XQA's block
    table [B, max_pages], a sequence's row padded with page 0 (never read: past its length)."""

    def __init__(self, lens, page_size):
        self.lens, self.page_size = list(lens), page_size
        counts = [-(-n // page_size) for n in self.lens]
        self.indptr = [0]
        for c in counts:
            self.indptr.append(self.indptr[-1] + c)
        self.n_pages = self.indptr[-1]
        self.indices = list(range(self.n_pages))
        self.last = [n - page_size * (c - 1) for n, c in zip(self.lens, counts)]
        self.max_pages = max(counts)
        self.table = [list(range(self.indptr[i], self.indptr[i + 1])) +
                      [0] * (self.max_pages - counts[i]) for i in range(len(self.lens))]

    def key_range(self, i):
        """[lo, hi) of sequence i's keys in the flat [n_pages * page_size] token axis."""
        lo = self.indptr[i] * self.page_size
        return lo, lo + self.lens[i]


def is_fi(peer):
    """A peer that needs FlashInfer (its import failing fails them all)."""
    return peer_impl(peer) in ("fi_cc", "fi_tc", "xqa")


def peer_group(peer):
    """What a peer reads: ('paged', kv dtype) caches, shared by the peers of one dtype, or
    ('floor', format) buffers of its own."""
    return ("floor", peer_kv(peer)) if peer.startswith("floor_") else ("paged", peer_kv(peer))


def groups_of(peer_list):
    """[(group, [peers])] in the order of the peers' first appearance."""
    out = []
    for p in peer_list:
        g = peer_group(p)
        for gg, ps in out:
            if gg == g:
                ps.append(p)
                break
        else:
            out.append((g, [p]))
    return out


ELEM_BYTES = {"f16": 2.0, "e4m3": 1.0}


def kv_bytes(peer, lens, hkv=N_KV_HEADS, d=HEAD_DIM):
    """K + V bytes that a peer has to read for one call (peers.py's count: no q, no out)."""
    keys = sum(lens)
    if peer_kv(peer) == "q8q5":
        return int(keys * hkv * (d // 32) * Q8Q5_BYTES_PER_BLOCK)
    return int(keys * hkv * d * 2 * ELEM_BYTES[peer_kv(peer)])


def cache_bytes(kv, pages, hkv=N_KV_HEADS, d=HEAD_DIM):
    """Bytes of one copy of a paged K + V cache (whole pages)."""
    return int(pages.n_pages * pages.page_size * hkv * d * 2 * ELEM_BYTES[kv])


def kvlayer_bytes(lens, hkv=N_KV_HEADS, d=HEAD_DIM, gqa=GQA):
    """The bytes kvlayer bench counts for a batch row: q8_0 K + q5_1 V of every key, plus fp32
    q and out of every sequence."""
    return float(sum(lens) * hkv * (d // 32) * Q8Q5_BYTES_PER_BLOCK +
                 2.0 * len(lens) * hkv * gqa * d * 4)


def copies_for(bytes_per_copy, rotate_mb, max_copy_gb, l2_bytes):
    """Cache copies per graph: enough that the bytes between two uses of one copy exceed
    rotate_mb, at least 2 (a copy of >= 4x the L2 alone: 1), and all copies within max_copy_gb
    (at least 1)."""
    n = max(1, bytes_per_copy)
    low = 1 if n >= 4 * l2_bytes else 2
    want = max(low, math.ceil(rotate_mb * 1e6 / n))
    cap = max(1, int(max_copy_gb * 1e9 // n))
    return max(1, min(want, cap, 4096))


def check_seqs(b):
    """The sequences whose output is checked: the first and the last."""
    return sorted({0, b - 1})


def base_row(peer, case, b, lens, page_size):
    return {"peer": peer, "case": case, "batch": b, "keys": sum(lens), "min_keys": min(lens),
            "max_keys": max(lens), "n_kv_heads": N_KV_HEADS, "head_dim": HEAD_DIM, "gqa": GQA,
            "n_q_heads": N_Q_HEADS, "page_size": page_size, "us": None,
            "bytes": kv_bytes(peer, lens), "kvlayer_bytes": kvlayer_bytes(lens),
            "max_abs_err": None, "ok": None, "note": ""}


# ---------------------------------------------------------------------------------------
# the run (any runner: TorchRunner on the GPU, a fake one in the CPU test)


def run_all(a, runner, rows, dump, t0, fi_error=None):
    """Every (case, B) row of every peer into `rows`; fi_error: why FlashInfer cannot be used
    (its peers' rows say so and are not tried)."""
    over = lambda: time.time() - t0 > a.budget_s  # noqa: E731

    for case, b in points(a):
        lens = seq_lens(case, b)
        for group, gpeers in groups_of(a.peer_list):
            todo = []
            for p in gpeers:
                row = base_row(p, case, b, lens, a.page_size)
                if over():
                    row["error"] = "skipped: time budget"
                elif fi_error and is_fi(p):
                    row["error"] = f"flashinfer import failed: {fi_error}"
                else:
                    todo.append((p, row))
                    continue
                rows.append(row)
            if not todo:
                continue
            setup = {}
            ctx = None
            if guarded(runner, rows, f"setup {case} B{b} {group}", setup,
                       lambda: {"ctx": runner.open(case, b, lens, group)}) is None:
                ctx = setup.pop("ctx")
            try:
                for p, row in todo:
                    if ctx is None:
                        row["error"] = f"setup: {setup.get('error')}"
                    elif over():
                        row["error"] = "skipped: time budget"
                    elif fi_error and is_fi(p):
                        row["error"] = f"flashinfer import failed: {fi_error}"
                    if row.get("error"):
                        rows.append(row)
                        continue
                    t1 = time.time()
                    e = guarded(runner, rows, f"{case} B{b} {p}", row,
                                lambda: runner.measure(ctx, p), row)
                    row["wall_s"] = round(time.time() - t1, 2)
                    if isinstance(e, ImportError) and is_fi(p):
                        fi_error = row["error"]
                    if e is None and row.get("max_abs_err") is not None:
                        row["ok"] = within(row["max_abs_err"], row["ref_max_abs"])
                        if not row["ok"]:
                            row["suspect"] = "output differs from the fp32 reference by >10%"
                            row["note"] = "; ".join(x for x in (row["note"], row["suspect"])
                                                    if x)
                    rows.append(row)
                    if e is None:
                        err = row.get("max_abs_err")
                        print(f"  {case:>4} B{b:<4} {row['keys']:>8} {p:<12} {row['us']:9.2f} us "
                              f"{row['bytes'] / row['us'] / 1e3:7.0f} GB/s  err "
                              f"{'-' if err is None else f'{err:.1e}'}  ok {row['ok']}  "
                              f"({row.get('method')}, {row.get('calls_per_graph')} calls, "
                              f"{row.get('copies')} copies, {row['wall_s']:.1f} s)", flush=True)
                    dump()
            finally:
                if ctx is not None:
                    runner.close(ctx)
    return fi_error


# ---------------------------------------------------------------------------------------
# the GPU side (torch, peers.py, FlashInfer): imported only when measuring


class BatchCtx:
    """One row's data for one group of peers: the queries [B, n_q, D], the page tables and the
    cache copies [(k, v)], each [pages, page_size, n_kv, D]."""

    def __init__(self, torch, case, b, lens, group, pages):
        self.torch, self.case, self.b, self.lens, self.group = torch, case, b, lens, group
        self.pages = pages
        self.hkv, self.d, self.gqa, self.hq = N_KV_HEADS, HEAD_DIM, GQA, N_Q_HEADS
        self.keys = sum(lens)
        self.sm_scale = 1.0 / math.sqrt(HEAD_DIM)
        self.q = None
        self.kvs = []
        self.refs = None  # {sequence: fp32 reference [n_q, D]}
        self.keep = []


class CopiesFor:
    """The `timer` that peers.build_floor asks for copies_for()."""

    def __init__(self, a, l2_bytes):
        self.a, self.l2_bytes = a, l2_bytes

    def copies_for(self, nbytes):
        return copies_for(nbytes, self.a.rotate_mb, self.a.max_copy_gb, self.l2_bytes)


class FloorCtx:
    """What peers.build_floor reads of its ctx."""

    def __init__(self, torch, keys, timer):
        self.torch, self.keys, self.hkv, self.d = torch, keys, N_KV_HEADS, HEAD_DIM
        self.timer, self.keep = timer, []


def per_copy(call, kvs, out):
    """(calls, out0) of a peer whose call(k, v) writes `out`: one zero-argument call per cache
    copy (k, v) for the Timer; out0() runs copy 0's and returns out."""
    calls = [functools.partial(call, k, v) for k, v in kvs]

    def out0():
        calls[0]()
        return out
    return calls, out0


class TorchRunner:
    def __init__(self, torch, pm, a):
        self.torch, self.pm, self.a = torch, pm, a
        self.timer = pm.Timer(torch, a)
        self.dev = pm.DEVICE
        l2 = None
        if self.dev == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
        self.copies = CopiesFor(a, l2 or DEFAULT_L2_BYTES)
        self._fid = None

    def env(self):
        info = self.pm.env_info(self.torch)
        info["l2_bytes_used"] = self.copies.l2_bytes
        try:
            self.fid()
            info["flashinfer_decode"] = "imported"
        except Exception as e:
            info["flashinfer_decode"] = short(e)
        return info

    def fid(self):
        if self._fid is None:
            self._fid = self.pm.import_flashinfer_decode()
        return self._fid

    def synchronize(self):
        self.torch.cuda.synchronize()

    def dtype(self, kv):
        return {"f16": self.torch.float16, "e4m3": self.torch.float8_e4m3fn}[kv]

    def open(self, case, b, lens, group):
        torch = self.torch
        pages = Pages(lens, self.a.page_size)
        ctx = BatchCtx(torch, case, b, lens, group, pages)
        if group[0] == "floor":
            return ctx
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(1000 * b + CASES.index(case))  # the same queries for every group
        ctx.q = torch.randn(b, ctx.hq, ctx.d, device=self.dev, dtype=torch.float32,
                            generator=gen).half()
        dt = self.dtype(group[1])
        n = self.copies.copies_for(cache_bytes(group[1], pages))
        shape = (pages.n_pages, pages.page_size, ctx.hkv, ctx.d)
        if self.dev == "cuda":
            torch.cuda.empty_cache()
        for _ in range(n):
            pair = []
            for _kv in range(2):
                t = torch.randn(shape, device=self.dev, dtype=torch.float16, generator=gen)
                pair.append(t if dt == torch.float16 else t.to(dt))
                del t
            ctx.kvs.append(tuple(pair))
        return ctx

    def close(self, ctx):
        ctx.keep.clear()
        ctx.kvs = []
        ctx.refs = None
        if self.dev == "cuda":
            self.torch.cuda.empty_cache()

    def references(self, ctx):
        """{sequence: fp32 attention [n_q, D]} on copy 0's dequantized values."""
        if ctx.refs is None:
            k0, v0 = ctx.kvs[0]
            kf, vf = k0.view(-1, ctx.hkv, ctx.d), v0.view(-1, ctx.hkv, ctx.d)
            ctx.refs = {}
            for i in check_seqs(ctx.b):
                lo, hi = ctx.pages.key_range(i)
                ctx.refs[i] = self.pm.reference(self.torch, ctx.q[i], kf[lo:hi].float(),
                                                vf[lo:hi].float(), ctx.gqa, ctx.sm_scale)
        return ctx.refs

    def _index(self, values, dtype):
        return self.torch.tensor(values, dtype=dtype, device=self.dev)

    def _fi(self, ctx, peer, tensor_cores):
        torch = self.torch
        fid = self.fid()
        dt = self.dtype(peer_kv(peer))
        pg = ctx.pages
        ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.dev)
        indptr = self._index(pg.indptr, torch.int32)
        indices = self._index(pg.indices, torch.int32)
        last = self._index(pg.last, torch.int32)
        w = fid.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last, backend="fa2")
        w.plan(indptr, indices, last, ctx.hq, ctx.hkv, ctx.d, pg.page_size,
               pos_encoding_mode="NONE", q_data_type=torch.float16, kv_data_type=dt,
               sm_scale=ctx.sm_scale)
        out = torch.empty_like(ctx.q)
        ctx.keep.append((w, ws, indptr, indices, last, out))
        return per_copy(lambda k, v: w.run(ctx.q, (k, v), out=out), ctx.kvs, out)

    def _xqa(self, ctx, peer):
        torch = self.torch
        fid = self.fid()
        pg = ctx.pages
        ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.dev)  # semaphores: 0
        table = self._index(pg.table, torch.int32)  # [B, max pages]
        lens = self._index(pg.lens, torch.uint32)  # [B]
        out = torch.empty_like(ctx.q)
        max_len = max(pg.lens)
        ctx.keep.append((ws, table, lens, out))

        def call(k, v):
            return fid.xqa_batch_decode_with_kv_cache(
                ctx.q, (k, v), ws, table, lens, max_len, bmm1_scale=ctx.sm_scale,
                bmm2_scale=1.0, out=out, kv_layout="NHD")
        return per_copy(call, ctx.kvs, out)

    def build(self, ctx, peer):
        """(calls, out0): calls time the peer, out0() is its [B, n_q, D] output on copy 0 (None:
        nothing to check)."""
        impl = peer_impl(peer)
        if impl == "floor":
            fctx = FloorCtx(self.torch, ctx.keys, self.copies)
            calls, _ = self.pm.build_floor(fctx, peer_kv(peer))
            ctx.keep.append(fctx.keep)
            return calls, None
        if impl in ("fi_cc", "fi_tc"):
            return self._fi(ctx, peer, tensor_cores=impl == "fi_tc")
        if impl == "xqa":
            return self._xqa(ctx, peer)
        raise ValueError(peer)

    def error(self, ctx, out0):
        o = out0()
        refs = self.references(ctx)
        err = ref_max = 0.0
        for i, ref in refs.items():
            err = max(err, float((o[i].float() - ref).abs().max()))
            ref_max = max(ref_max, float(ref.abs().max()))
        return {"max_abs_err": err, "ref_max_abs": ref_max, "checked_seqs": sorted(refs)}

    def measure(self, ctx, peer):
        try:
            calls, out0 = self.build(ctx, peer)
            fields = {}
            if out0 is not None and not self.a.no_check:
                fields.update(self.error(ctx, out0))
            us, method, ncalls, us_min = self.timer.run(calls)
            nbytes = kv_bytes(peer, ctx.lens)
            fields.update(us=us, us_min=us_min, method=method, calls_per_graph=ncalls,
                          copies=len(calls), gbps=nbytes / (us * 1e-6) / 1e9)
            return fields
        finally:
            ctx.keep.clear()


# ---------------------------------------------------------------------------------------


def fmt_table(rows):
    lines = [f"{'case':>4} {'B':>4} {'keys':>8} {'peer':<12} {'us':>9} {'GB/s':>7} {'err':>8} "
             f"{'ok':>5}  note"]
    for r in rows:
        us = f"{r['us']:.2f}" if r.get("us") is not None else "-"
        gb = f"{r['gbps']:.0f}" if r.get("gbps") else "-"
        err = f"{r['max_abs_err']:.1e}" if r.get("max_abs_err") is not None else "-"
        note = r.get("error") or r.get("note") or (
            r.get("method") if r.get("method") not in (None, "graph") else "")
        lines.append(f"{r['case']:>4} {r['batch']:>4} {r['keys']:>8} {r['peer']:<12} {us:>9} "
                     f"{gb:>7} {err:>8} {str(r['ok']):>5}  {note[:100]}")
    return "\n".join(lines)


def fmt_pivot(rows, peer_list):
    """One line per (case, B), one column per peer, us ('-' = error or skipped)."""
    cols = [p for p in ALL_PEERS if p in peer_list]
    out = ["us per call (median, CUDA graph, cold L2; ! = off the fp32 check by > 10%):",
           f"{'case':>4} {'B':>4} {'keys':>8} " + " ".join(f"{p:>11}" for p in cols)]
    cell, order = {}, []
    for r in rows:
        k = (r["case"], r["batch"], r["keys"])
        if k not in cell:
            cell[k] = {}
            order.append(k)
        cell[k][r["peer"]] = r
    for k in order:
        vals = []
        for p in cols:
            r = cell[k].get(p)
            if r is None or r.get("us") is None:
                vals.append(f"{'-':>11}")
            else:
                vals.append(f"{r['us']:10.1f}" + ("!" if r.get("ok") is False else " "))
        out.append(f"{k[0]:>4} {k[1]:>4} {k[2]:>8} " + " ".join(vals))
    return "\n".join(out)


def print_plan(a):
    print(f"{'case':>4} {'B':>4} {'keys':>8} {'min..max L':>13} {'pages':>6} {'kvlayer MB':>10} "
          f"{'f16 MB/copy':>11} {'copies':>6}  (copies for a {DEFAULT_L2_BYTES >> 20} MB L2)")
    for case, b in points(a):
        lens = seq_lens(case, b)
        pg = Pages(lens, a.page_size)
        nbytes = cache_bytes("f16", pg)
        n = copies_for(nbytes, a.rotate_mb, a.max_copy_gb, DEFAULT_L2_BYTES)
        print(f"{case:>4} {b:>4} {sum(lens):>8} {f'{min(lens)}..{max(lens)}':>13} "
              f"{pg.n_pages:>6} {kvlayer_bytes(lens) / 1e6:>10.1f} {nbytes / 1e6:>11.1f} "
              f"{n:>6}")
    print(f"peers: {','.join(a.peer_list)}")


def main(argv=None, runner_factory=None):
    """runner_factory(a) -> a runner (tests pass a fake one; default: TorchRunner on CUDA)."""
    a = parse_args(argv)
    pts = points(a)
    print(f"batch_peers.py: {len(pts)} (case, B) rows x {len(a.peer_list)} peers = "
          f"{len(pts) * len(a.peer_list)} measurements, {N_KV_HEADS}x{HEAD_DIM} gqa {GQA}, "
          f"budget {a.budget_s:.0f} s", flush=True)
    if a.dry_run:
        print_plan(a)
        return 0
    if not a.allow_jit:
        os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    t0 = time.time()
    if runner_factory is None:
        try:
            pm = import_peers(a.peers_dir)
        except ImportError as e:
            print(f"batch_peers.py: {e}: nothing to measure", flush=True)
            return 3
        torch = cuda_torch("batch_peers.py")
        if torch is None:
            return 3
        runner = TorchRunner(torch, pm, a)
    else:
        runner = runner_factory(a)
    info = runner.env()
    print("env:", json.dumps(info), flush=True)
    result = {"env": info,
              "args": json_args(a),
              "kvlayer_row": KVLAYER_ROW,
              "method": "each peer captured in one CUDA graph of >= min_calls calls over "
                        "rotating cache copies (cold L2), median replay / calls (peers.py's "
                        "Timer); fp32 reference on copy 0 for the first and last sequence",
              "rows": []}

    def dump():
        write_json(a.json, result)

    fi = info.get("flashinfer_decode")
    fi_error = fi if fi and fi != "imported" else None
    rc = run_saved("batch_peers.py",
                   lambda: run_all(a, runner, result["rows"], dump, t0, fi_error), result, dump, t0)
    print()
    print(fmt_table(result["rows"]))
    print()
    print(fmt_pivot(result["rows"], a.peer_list))
    print(f"\ntotal {result['total_s']} s; json: {a.json}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
