#!/usr/bin/env python3
"""CPU checks of tools/batch_peers.py (no GPU; standard library, torch where installed): the
rows and their lengths (the log-uniform L_i), the page tables against
FlashInfer's and XQA's reading of them, the byte counts (kvlayer's among them), the cache copies,
argument parsing and --dry-run, the run loop and its JSON on a fake runner (flags, failures with
their reason, a FlashInfer import failure, the time budget, a sticky error). With torch: the
GPU-side code (caches, page tables, queries, the fp32 reference check) on the CPU against a fake
FlashInfer that reads the tables as its documentation says, and a misread table is flagged.

    python3 tools/test_batch_peers.py        (exit 0: all passed)
"""
import json
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import batch_peers as bp  # noqa: E402
from peer_test_common import (Skip, assert_usage_error, optional, peers_or_skip,  # noqa: E402
                              quiet, run_main, run_tests)

torch = optional("torch")


def test_lengths():
    assert bp.seq_lens("log", 8) == [347, 636, 1166, 2139, 3922, 7194, 13193, 24196]
    assert bp.log_len(0, 8) == 347 and bp.log_len(7, 8) == 24196
    l32, l128 = bp.seq_lens("log", 32), bp.seq_lens("log", 128)
    assert l32[0] == 276 and l32[-1] == 30376 and sum(l32) == 214215
    assert l128[0] == 261 and l128[-1] == 32153 and sum(l128) == 857635
    assert sum(bp.seq_lens("log", 8)) == 52793
    for b in (1, 2, 3, 8, 32, 100, 128):
        lens = bp.seq_lens("log", b)
        assert len(lens) == b and all(256 <= n <= 32768 for n in lens), b
        assert all(x < y for x, y in zip(lens, lens[1:])) or b == 1, b
        for i, n in enumerate(lens):  # the definition, to the rounding
            assert abs(n - 256 * 2 ** (7 * (i + 0.5) / b)) <= 0.5, (b, i)
        # symmetric in log: L_i * L_(b-1-i) = 256 * 32768 (to the rounding)
        for i in range(b):
            assert abs(math.log2(lens[i] * lens[b - 1 - i] / (256 * 32768))) < 0.01, (b, i)
    assert bp.seq_lens("4k", 32) == [4096] * 32 and bp.seq_lens("128k", 8) == [131072] * 8
    print("lengths: 4k, 128k and the log-uniform L_i ok")


def test_points_and_args():
    a = bp.parse_args([])
    assert bp.points(a) == [("4k", 8), ("4k", 32), ("4k", 128), ("log", 8), ("log", 32),
                            ("log", 128), ("128k", 8)]
    assert a.peer_list == bp.ALL_PEERS and a.page_size == 32 and a.budget_s == 150
    a = bp.parse_args(["--cases", "128k,log", "--batches", "4,16", "--peers", "all",
                       "--skip", "floor_q8q5,xqa_f16"])
    assert bp.points(a) == [("128k", 4), ("log", 4), ("log", 16)]
    assert "floor_q8q5" not in a.peer_list and "xqa_f16" not in a.peer_list
    assert bp.points(bp.parse_args(["--cases", "128k", "--batches", "32"])) == []
    a = bp.parse_args(["--peers", "xqa_e4m3,fi_tc_e4m3", "--budget-s", "60", "--allow-jit"])
    assert a.peer_list == ["xqa_e4m3", "fi_tc_e4m3"] and a.budget_s == 60 and a.allow_jit
    for bad in (["--peers", "sdpa_cudnn_f16"], ["--cases", "8k"], ["--batches", "0"],
                ["--batches", "x"], ["--cases", ""], ["--page-size", "0"]):
        assert_usage_error(bp.parse_args, bad)
    with tempfile.TemporaryFile("w+") as f:
        saved = sys.stdout
        sys.stdout = f
        try:
            assert bp.main(["--dry-run"]) == 0
        finally:
            sys.stdout = saved
        f.seek(0)
        text = f.read()
    assert "7 (case, B) rows x 7 peers = 49 measurements" in text
    lines = [ln.split() for ln in text.splitlines()]
    assert ["log", "128", "857635", "261..32153", "26862", "1600.2", "3520.9", "1"] in lines
    assert ["128k", "8", "1048576", "131072..131072", "32768", "1946.7", "4295.0", "1"] in lines
    assert len([x for x in lines if x and x[0] in bp.CASES]) == 7
    print("rows, arguments and --dry-run ok")


def fi_read(flat_pages, pg, i):
    """FlashInfer's paged KV (NHD): request i's keys are its pages indices[indptr[i]:indptr[i+1]]
    in order, all full but the last, which holds last_page_len[i] keys."""
    pages = pg.indices[pg.indptr[i]:pg.indptr[i + 1]]
    out = []
    for j, p in enumerate(pages):
        n = pg.last[i] if j == len(pages) - 1 else pg.page_size
        out += flat_pages[p][:n]
    return out


def xqa_read(flat_pages, table, seq_lens, page_size, i):
    """XQA: request i's key t lies in page table[i][t // page_size] at t % page_size, for
    t < seq_lens[i]; the table has max_seq_len / page_size columns."""
    return [flat_pages[table[i][t // page_size]][t % page_size] for t in range(seq_lens[i])]


def test_pages():
    n_cases = 0
    for lens, ps in [([4096] * 3, 32), (bp.seq_lens("log", 8), 32), (bp.seq_lens("log", 32), 16),
                     ([1, 31, 32, 33, 64, 65], 32), ([5], 1), ([7, 1, 300], 64)]:
        pg = bp.Pages(lens, ps)
        assert pg.indptr[0] == 0 and len(pg.indptr) == len(lens) + 1
        assert pg.indices == list(range(pg.n_pages)) and len(pg.last) == len(lens)
        assert pg.max_pages * ps >= max(lens) and pg.max_pages == max(-(-n // ps) for n in lens)
        assert all(1 <= x <= ps for x in pg.last)
        assert len(pg.table) == len(lens) and all(len(r) == pg.max_pages for r in pg.table)
        # token t of the flat [pages * page_size] axis holds the value t
        flat = [list(range(p * ps, (p + 1) * ps)) for p in range(pg.n_pages)]
        for i, n in enumerate(lens):
            lo, hi = pg.key_range(i)
            assert hi - lo == n and lo % ps == 0
            want = list(range(lo, hi))
            assert fi_read(flat, pg, i) == want, (lens, ps, i)
            assert xqa_read(flat, pg.table, lens, ps, i) == want, (lens, ps, i)
            if i:  # one sequence after the other, none overlapping
                assert lo >= pg.key_range(i - 1)[1]
            n_cases += 1
    pg = bp.Pages(bp.seq_lens("log", 128), 32)
    assert pg.n_pages == 26862 and bp.cache_bytes("f16", pg) == 26862 * 32 * 8 * 128 * 4
    print(f"page tables: {n_cases} sequences read alike by FlashInfer's and XQA's rules")


def test_bytes_and_copies():
    lens = bp.seq_lens("4k", 8)
    assert bp.kv_bytes("fi_cc_f16", lens) == 32768 * 8 * 128 * 2 * 2
    assert bp.kv_bytes("xqa_e4m3", lens) == 32768 * 8 * 128 * 2
    assert bp.kv_bytes("floor_q8q5", lens) == 32768 * 8 * 4 * 58
    for case, b in [("4k", 8), ("log", 32), ("log", 128), ("128k", 8)]:
        lens = bp.seq_lens(case, b)
        # the count: sum L_i * 8 * (128 / 32) * (34 + 24) + q and out (fp32)
        want = sum(n * 8 * (128 // 32) * (34 + 24) for n in lens) + 2 * b * 64 * 128 * 4
        assert bp.kvlayer_bytes(lens) == want, (case, b)
        assert bp.kv_bytes("floor_q8q5", lens) == want - 2 * b * 64 * 128 * 4
    l2 = 50 << 20
    c = lambda n, rot=256.0, cap=8.0: bp.copies_for(n, rot, cap, l2)  # noqa: E731
    assert c(10) == 4096 and c(0) == 4096
    assert c(134_217_728) == 2  # 4k B=8 fp16: 2 x 134 MB > 256 MB
    assert c(67_108_864) == 4  # its e4m3 cache
    assert c(4 * l2) == 2 and c(4 * l2 + 1, rot=1000.0) == 5  # 4x the L2: 1 allowed, not forced
    assert c(3_520_921_600) == 1 and c(300_000_000) == 1  # one copy is >= 4x the L2
    assert c(3_000_000_000, rot=12000.0) == 2  # 8 GB cap: 2 copies of 3 GB
    assert c(9_000_000_000, rot=12000.0) == 1  # a copy beyond the cap: still 1
    assert c(100_000_000, cap=0.1) == 1  # 2 wanted, 1 allowed by the cap
    a = bp.parse_args([])
    for case, b in bp.points(a):  # every row's copies fit an 80 GB card with room to spare
        pg = bp.Pages(bp.seq_lens(case, b), a.page_size)
        n = bp.copies_for(bp.cache_bytes("f16", pg), a.rotate_mb, a.max_copy_gb, l2)
        assert n * bp.cache_bytes("f16", pg) <= max(a.max_copy_gb * 1e9,
                                                    bp.cache_bytes("f16", pg)) < 20e9
    assert bp.check_seqs(8) == [0, 7] and bp.check_seqs(1) == [0]
    assert bp.within(0.1, 1.0) and not bp.within(0.2, 1.0)
    assert [g for g, _ in bp.groups_of(bp.ALL_PEERS)] == [("paged", "f16"), ("paged", "e4m3"),
                                                          ("floor", "q8q5")]
    assert bp.groups_of(bp.ALL_PEERS)[0][1] == ["fi_cc_f16", "fi_tc_f16", "xqa_f16"]
    assert bp.is_fi("xqa_e4m3") and bp.is_fi("fi_cc_f16") and not bp.is_fi("floor_q8q5")
    print("bytes (kvlayer's count too), cache copies and peer groups ok")


class FakeRunner:
    """What run_all needs of a runner, without a GPU. fi_tc_e4m3 fails (not prebuilt), xqa_f16 is
    off by 50% on the log rows, the f16 caches of log B=128 do not fit; us = keys / 1000."""

    def __init__(self, a, sticky_at=None, import_error_at=None, env_error=None):
        self.a = a
        self.opened, self.closed, self.measured = [], 0, []
        self.sticky_at, self.import_error_at, self.env_error = sticky_at, import_error_at, env_error
        self.broken = False

    def env(self):
        return {"device": "fake GPU",
                "flashinfer_decode": self.env_error or "imported"}

    def synchronize(self):
        if self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def open(self, case, b, lens, group):
        self.opened.append((case, b, group))
        if (case, b, group) == ("log", 128, ("paged", "f16")):
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.76 GiB")
        return {"case": case, "b": b, "lens": lens}

    def close(self, ctx):
        self.closed += 1

    def measure(self, ctx, peer):
        self.measured.append((ctx["case"], ctx["b"], peer))
        n = len(self.measured)
        if n == self.sticky_at:
            self.broken = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if n == self.import_error_at:
            raise ImportError("libcuda.so.1: cannot open shared object file")
        if peer == "fi_tc_e4m3":
            raise RuntimeError("JIT is disabled (FLASHINFER_DISABLE_JIT) and batch_prefill_with_"
                               "kv_cache_... is not prebuilt")
        f = {"us": sum(ctx["lens"]) / 1000.0, "us_min": 1.0, "method": "graph",
             "calls_per_graph": 16, "copies": 1}
        if peer != "floor_q8q5":
            bad = peer == "xqa_f16" and ctx["case"] == "log"
            f.update(max_abs_err=0.5 if bad else 1e-3, ref_max_abs=1.0, checked_seqs=[0, 1])
        return f


ROW_KEYS = {"peer", "case", "batch", "keys", "min_keys", "max_keys", "n_kv_heads", "head_dim",
            "gqa", "n_q_heads", "page_size", "us", "bytes", "kvlayer_bytes", "max_abs_err", "ok",
            "note"}


def run_fake(extra, **fake):
    return run_main(bp.main, FakeRunner, extra, **fake)


def test_run_loop_json():
    rc, res, fake = run_fake([])
    assert rc == 0 and res["env"]["device"] == "fake GPU" and "total_s" in res
    assert res["kvlayer_row"] == "batch_dc_graph"
    rows = res["rows"]
    assert len(rows) == 7 * 7, len(rows)
    for r in rows:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert (r["n_kv_heads"], r["head_dim"], r["gqa"], r["n_q_heads"]) == (8, 128, 8, 64)
        assert r["keys"] == sum(bp.seq_lens(r["case"], r["batch"]))
    json.dumps(res)
    by = {(r["case"], r["batch"], r["peer"]): r for r in rows}
    r = by[("4k", 32, "fi_cc_f16")]
    assert r["us"] == 131.072 and r["ok"] is True and r["max_abs_err"] == 1e-3 and not r["note"]
    assert r["bytes"] == 131072 * 8 * 128 * 4 and r["min_keys"] == r["max_keys"] == 4096
    r = by[("log", 8, "xqa_f16")]
    assert r["ok"] is False and "fp32 reference" in r["suspect"] and r["us"] == 52.793
    assert by[("4k", 8, "xqa_f16")]["ok"] is True
    r = by[("128k", 8, "fi_tc_e4m3")]
    assert r["us"] is None and r["ok"] is None and "not prebuilt" in r["error"]
    r = by[("log", 128, "fi_tc_f16")]
    assert r["us"] is None and r["error"].startswith("setup: RuntimeError: CUDA out of memory")
    assert by[("log", 128, "fi_cc_e4m3")]["us"] is not None  # the next group goes on
    r = by[("log", 8, "floor_q8q5")]
    assert r["ok"] is None and r["max_abs_err"] is None and r["bytes"] == 52793 * 8 * 4 * 58
    assert (r["min_keys"], r["max_keys"]) == (347, 24196)
    # one cache per (row, group), each closed; none measured from the failed setup
    assert len(fake.opened) == 7 * 3 and fake.closed == 7 * 3 - 1
    assert ("log", 128, "xqa_f16") not in fake.measured
    print(f"run loop: {len(rows)} rows, flags, failures and setup errors ok")


def test_import_failures_budget_sticky():
    # FlashInfer does not import (env): its peers' rows say why, no cache is made for them
    rc, res, fake = run_fake(["--cases", "4k"], env_error="ImportError: no module flashinfer")
    assert rc == 0 and len(res["rows"]) == 3 * 7
    for r in res["rows"]:
        if r["peer"] == "floor_q8q5":
            assert r["us"] is not None
        else:
            assert r["us"] is None and r["error"] == ("flashinfer import failed: ImportError: "
                                                      "no module flashinfer")
    assert all(g == ("floor", "q8q5") for _, _, g in fake.opened)
    # an ImportError in a FlashInfer peer: every later FlashInfer row gets its reason
    rc, res, fake = run_fake(["--cases", "4k", "--batches", "8"], import_error_at=2)
    by = {r["peer"]: r for r in res["rows"]}
    assert by["fi_cc_f16"]["us"] is not None
    assert by["fi_tc_f16"]["error"].startswith("ImportError: libcuda.so.1")
    for p in ("xqa_f16", "fi_cc_e4m3", "fi_tc_e4m3", "xqa_e4m3"):
        assert by[p]["error"].startswith("flashinfer import failed: ImportError"), p
    assert by["floor_q8q5"]["us"] is not None and len(fake.measured) == 3
    # the budget: nothing opened, every row skipped
    rc, res, fake = run_fake(["--budget-s", "0"])
    assert rc == 0 and not fake.opened and len(res["rows"]) == 49
    assert all(r["error"] == "skipped: time budget" for r in res["rows"])
    # --no-check is the runner's business; the loop keeps ok None without an error measure
    # a sticky error: the run stops with rc 2, the row kept, every cache closed
    rc, res, fake = run_fake([], sticky_at=4)
    assert rc == 2 and "illegal memory access" in res["stopped"]
    bad = [r for r in res["rows"] if "sticky" in (r.get("error") or "")]
    assert len(bad) == 1 and fake.closed == len(fake.opened) and len(res["rows"]) == 4
    print("import failures, time budget and a sticky CUDA error ok")


def test_peers_import():
    pm, d = peers_or_skip()
    for name in ("Timer", "reference", "build_floor", "env_info", "import_flashinfer_decode",
                 "DEVICE", "kv_bytes"):
        assert hasattr(pm, name), name
    # peers.py's floor reads kv_bytes('x_q8q5', keys, 8, 128): the same bytes as ours
    lens = bp.seq_lens("log", 32)
    assert pm.kv_bytes("x_q8q5", sum(lens), 8, 128) == bp.kv_bytes("floor_q8q5", lens)
    assert pm.kv_bytes("fi_batch_e4m3", sum(lens), 8, 128) == bp.kv_bytes("fi_cc_e4m3", lens)
    print(f"peers.py imported from {d}")


# ---------------------------------------------------------------------------------------
# with torch: the GPU-side code on the CPU


class FakeFlashInfer:
    """flashinfer.decode as its documentation reads: the wrapper's paged KV (indptr, indices,
    last_page_len) and XQA's block table + uint32 seq_lens, attention in fp32. shift: XQA reads
    the block table's next row (a misread table, which the check must flag)."""

    def __init__(self, pm, shift=0):
        self.pm, self.shift = pm, shift
        self.plans = []
        fake = self

        class Wrapper:
            def __init__(self, ws, layout, use_cuda_graph, use_tensor_cores,
                         paged_kv_indptr_buffer, paged_kv_indices_buffer,
                         paged_kv_last_page_len_buffer, backend):
                assert layout == "NHD" and use_cuda_graph and backend == "fa2"
                assert len(paged_kv_indptr_buffer) == len(paged_kv_last_page_len_buffer) + 1
                self.buf = (paged_kv_indptr_buffer, paged_kv_indices_buffer,
                            paged_kv_last_page_len_buffer)

            def plan(self, indptr, indices, last, hq, hkv, d, ps, pos_encoding_mode,
                     q_data_type, kv_data_type, sm_scale):
                assert indptr.dtype == indices.dtype == last.dtype == torch.int32
                assert len(indices) <= len(self.buf[1]) and pos_encoding_mode == "NONE"
                self.p = (indptr.tolist(), indices.tolist(), last.tolist(), hkv, ps, sm_scale)
                fake.plans.append((hq, hkv, d, ps, kv_data_type))

            def run(self, q, kv, out):
                indptr, indices, last, hkv, ps, sm = self.p
                k, v = kv
                for i in range(q.shape[0]):
                    pages = indices[indptr[i]:indptr[i + 1]]
                    n = (len(pages) - 1) * ps + last[i]
                    kf = k[pages].reshape(-1, hkv, k.shape[-1])[:n].float()
                    vf = v[pages].reshape(-1, hkv, v.shape[-1])[:n].float()
                    out[i] = fake.pm.reference(torch, q[i], kf, vf, q.shape[1] // hkv, sm).half()
                return out

        self.BatchDecodeWithPagedKVCacheWrapper = Wrapper

    def xqa_batch_decode_with_kv_cache(self, q, kv, ws, table, seq_lens, max_seq_len,
                                       bmm1_scale, bmm2_scale, out, kv_layout):
        assert kv_layout == "NHD" and seq_lens.dtype == torch.uint32
        assert table.dtype == torch.int32 and table.shape[0] == q.shape[0] == seq_lens.shape[0]
        k, v = kv
        ps, hkv = k.shape[1], k.shape[2]
        assert max_seq_len <= table.shape[1] * ps
        lens = seq_lens.tolist()
        for i in range(q.shape[0]):
            row = table[(i + self.shift) % q.shape[0]].tolist()
            t = torch.arange(lens[i])
            pages = torch.tensor(row)[t // ps]
            kf = k[pages, t % ps].float() * bmm2_scale
            vf = v[pages, t % ps].float() * bmm2_scale
            out[i] = self.pm.reference(torch, q[i], kf, vf, q.shape[1] // hkv, bmm1_scale).half()
        return out


def test_torch_runner_on_cpu():
    if torch is None:
        raise Skip("torch not installed")
    pm = bp.import_peers()
    saved = (pm.DEVICE, pm.Timer.run)

    def fake_run(self, calls):
        calls[0]()
        return 5.0, "graph", 16, 4.0
    pm.DEVICE = "cpu"
    pm.Timer.run = fake_run
    try:
        a = bp.parse_args(["--cases", "log,4k", "--batches", "3,8", "--rotate-mb", "1"])
        r = bp.TorchRunner(torch, pm, a)
        r._fid = FakeFlashInfer(pm)
        r.synchronize = lambda: None
        assert r.copies.l2_bytes == bp.DEFAULT_L2_BYTES
        for case, b in [("log", 8), ("4k", 3)]:
            lens = bp.seq_lens(case, b)
            for kv in ("f16", "e4m3"):
                ctx = r.open(case, b, lens, ("paged", kv))
                assert ctx.q.shape == (b, 64, 128) and ctx.q.dtype == torch.float16
                k, v = ctx.kvs[0]
                assert k.shape == (ctx.pages.n_pages, 32, 8, 128)
                assert k.dtype == (torch.float16 if kv == "f16" else torch.float8_e4m3fn)
                for p in (f"fi_cc_{kv}", f"fi_tc_{kv}", f"xqa_{kv}"):
                    f = r.measure(ctx, p)
                    assert f["checked_seqs"] == [0, b - 1] and f["us"] == 5.0, f
                    assert bp.within(f["max_abs_err"], f["ref_max_abs"]), (case, b, p, f)
                    assert f["max_abs_err"] < 5e-3 and f["copies"] == len(ctx.kvs)
                    assert not ctx.keep
                r.close(ctx)
        # the same seed: the e4m3 cache is the f16 cache rounded, the queries are the same
        c16 = r.open("4k", 3, bp.seq_lens("4k", 3), ("paged", "f16"))
        c8 = r.open("4k", 3, bp.seq_lens("4k", 3), ("paged", "e4m3"))
        assert torch.equal(c16.q, c8.q)
        assert torch.equal(c16.kvs[0][0][:4].to(torch.float8_e4m3fn).float(),
                           c8.kvs[0][0][:4].float())
        # a misread block table (another sequence's pages): the check flags it
        r._fid = FakeFlashInfer(pm, shift=1)
        f = r.measure(c16, "xqa_f16")
        assert not bp.within(f["max_abs_err"], f["ref_max_abs"]), f
        # the loop on the CPU runner (no floor: it needs Triton on a GPU)
        a2 = bp.parse_args(["--cases", "log,4k", "--batches", "3,8", "--skip", "floor_q8q5"])
        rows = []
        quiet(bp.run_all, a2, r, rows, lambda: None, time.time())
        assert len(rows) == 4 * 6 and all(x["us"] == 5.0 for x in rows), rows
        flagged = {x["peer"] for x in rows if x["ok"] is False}
        assert flagged == {"xqa_f16", "xqa_e4m3"}, flagged  # the shifted table, every row
        assert all(x["ok"] is False for x in rows if x["peer"].startswith("xqa"))
    finally:
        pm.DEVICE, pm.Timer.run = saved
    print("GPU-side code on the CPU: caches, tables, references; a misread table is flagged")


if __name__ == "__main__":
    run_tests([test_lengths, test_points_and_args, test_pages, test_bytes_and_copies,
               test_run_loop_json, test_import_failures_budget_sticky, test_peers_import,
               test_torch_runner_on_cpu])
