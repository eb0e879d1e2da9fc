#!/usr/bin/env python3
"""CPU checks of tools/verify_peers.py (no GPU; standard library, numpy where installed, torch
where installed): the verify views and masks against their direct definition, FlashInfer's
packed mask bits, argument parsing, the plan, the run loop and its JSON on a fake runner (mask
forms chosen by the small check, fallbacks, flags, skips, the time budget, a sticky error), and
that the small check case moves an off-by-one mask far past the 10% flag. With torch: the fp32
reference against SDPA (math backend) and the SDPA peer code on the CPU.

    python3 tools/test_verify_peers.py        (exit 0: all passed)
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import verify_peers as vp  # noqa: E402
from peer_test_common import (Skip, assert_usage_error, optional, peers_or_skip,  # noqa: E402
                              quiet, run_main, run_tests)

np, torch = optional("numpy"), optional("torch")


def sees(keys, t, window, i, p):
    """The definition: query i of t over `keys` keys sees absolute key p."""
    last = keys - t + i
    return p <= last and (window is None or p >= last + 1 - window)


def cases():
    for keys in range(1, 41):
        for t in range(1, min(keys, 17) + 1):
            for window in (None, 1, 3, 8, 100):
                yield keys, t, window


def test_bounds_and_masks():
    n_cases = 0
    for keys, t, window in cases():
        for align in (1, 8, 32):
            start = vp.view_start(keys, t, window, align)
            assert start % align == 0 and 0 <= start <= keys
            if window is None:
                assert start == 0
            b = vp.query_bounds(keys, t, window, start)
            assert len(b) == t
            rows = vp.mask_rows(b, keys - start)
            for i in range(t):
                # no key before the slice is visible, and the slice's mask is the definition
                assert not any(sees(keys, t, window, i, p) for p in range(start))
                assert rows[i] == [sees(keys, t, window, i, start + j)
                                   for j in range(keys - start)], (keys, t, window, align, i)
            # a smaller t never needs an earlier slice: one cache, made for t_max, serves all t
            for t2 in range(1, t + 1):
                assert vp.view_start(keys, t2, window, align) >= start
            assert vp.is_lower_right(b, keys - start) == all(
                all(r[:hi + 1]) for r, (_, hi) in zip(rows, b)), (keys, t, window)
            n_cases += 1
    # the kvlayer bench case: 4096-key window at 128K keys, T = 16
    b = vp.query_bounds(131072, 16, 4096, 0)
    assert b[0] == (131072 - 16 - 4095, 131072 - 16) and b[15] == (131072 - 4096, 131071)
    assert vp.view_start(131072, 16, 4096, 32) == 126944  # 126961 rounded down to a page
    assert vp.view_start(131072, 1, 4096, 8) == 126976
    assert vp.is_lower_right(vp.query_bounds(4096, 8, None), 4096)
    assert not vp.is_lower_right(vp.query_bounds(131072, 8, 4096, 126960), 131072 - 126960)
    print(f"views and masks: {n_cases} cases match the definition")


def test_band_mask_numpy():
    if np is None:
        raise Skip("numpy not installed")
    for keys, t, window in cases():
        start = vp.view_start(keys, t, window, 8)
        b = vp.query_bounds(keys, t, window, start)
        m = vp.band_mask(np, b, keys - start)
        assert m.dtype == bool and m.shape == (t, keys - start)
        assert m.tolist() == vp.mask_rows(b, keys - start)
    print("band_mask (numpy) == mask_rows")


def test_pack_mask():
    for keys, t, window in [(40, 16, 8), (24, 16, None), (131, 7, 100), (9, 1, 3)]:
        start = vp.view_start(keys, t, window, 32)
        n = keys - start
        b = vp.query_bounds(keys, t, window, start)
        packed = vp.pack_mask_little(b, n)
        assert len(packed) == (t * n + 7) // 8
        rows = vp.mask_rows(b, n)
        for i in range(t):  # FlashInfer's read: offset = qo_idx * kv_len + kv_idx
            for j in range(n):
                off = i * n + j
                assert bool((packed[off // 8] >> (off % 8)) & 1) == rows[i][j]
        if np is not None:
            ref = np.packbits(np.array(rows, dtype=bool).ravel(), bitorder="little")
            assert bytes(ref) == packed
    print("packed custom mask: little-endian bits at qo_idx * kv_len + kv_idx")


def test_forms():
    assert vp.forms_for("sdpa_flash_f16", False) == ["lower_right"]
    assert vp.forms_for("sdpa_flash_f16", True) == []
    assert "no explicit mask" in vp.cannot_serve("sdpa_flash_f16")
    assert vp.forms_for("sdpa_cudnn_f16", False) == ["mask", "lower_right"]
    assert vp.forms_for("sdpa_cudnn_f16", True) == ["mask"]
    assert vp.forms_for("fi_prefill_e4m3", False) == ["causal"]
    assert vp.forms_for("fi_prefill_f16", True) == ["custom_mask"]
    assert vp.peer_group("sdpa_cudnn_f16") == ("HND", "f16")
    assert vp.peer_group("fi_prefill_e4m3") == ("NHD", "e4m3")
    for f in ("mask", "lower_right", "causal", "custom_mask"):
        assert f in vp.FORM_TEXT
    assert vp.check_case(16, False) == (24, None) and vp.check_case(16, True) == (40, 8)
    assert vp.within(0.1, 1.0) and not vp.within(0.2, 1.0)
    print("mask forms per peer ok")


def test_args():
    a = vp.parse_args([])
    assert a.geom_list == [(8, 128, 8), (4, 256, 8)]
    assert a.key_list == [4096, 16384, 131072] and a.window == 4096
    assert a.window_key_list == [131072] and a.query_list == [1, 2, 4, 8, 16, 32, 64]
    assert a.t_max == 64
    assert a.peer_list == vp.DEFAULT_PEERS and "sdpa_efficient_f16" not in a.peer_list
    assert [(g, k, w) for g, k, w in vp.points(a)][:4] == [
        ((8, 128, 8), 4096, None), ((8, 128, 8), 16384, None), ((8, 128, 8), 131072, None),
        ((8, 128, 8), 131072, 4096)]
    assert len(vp.points(a)) == 8
    a = vp.parse_args(["--geoms", "4x256x8", "--keys", "4096", "--window", "0",
                       "--queries", "2,8", "--peers", "all", "--skip", "sdpa_flash_f16"])
    assert a.window is None and a.window_key_list == [] and a.t_max == 8
    assert "sdpa_flash_f16" not in a.peer_list and len(vp.points(a)) == 1
    a = vp.parse_args(["--peers", "sdpa_efficient_f16,fi_prefill_e4m3", "--budget-s", "90"])
    assert a.peer_list == ["sdpa_efficient_f16", "fi_prefill_e4m3"] and a.budget_s == 90
    for bad in (["--peers", "xqa_e4m3"], ["--geoms", "8x128"], ["--queries", "0"],
                ["--keys", "a"], ["--window", "-1"]):
        assert_usage_error(vp.parse_args, bad)
    assert quiet(vp.main, ["--dry-run"]) == 0
    print("arguments, plan and --dry-run ok")


def attention_np(q, k, v, mask, gqa, scale):
    t, hq, d = q.shape
    s, hkv, _ = k.shape
    sc = np.einsum("thgd,shd->hgts", q.reshape(t, hkv, gqa, d), k) * scale
    sc = np.where(mask, sc, -np.inf)
    sc -= sc.max(-1, keepdims=True)
    p = np.exp(sc)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hgts,shd->thgd", p, v).reshape(t, hq, d)


def test_small_check_catches_mask_errors():
    """On the small case one key too many (or, windowed, too few at the front) moves the output
    by far more than peers.py's 10% flag, for both geometries; fp16 rounding does not."""
    if np is None:
        raise Skip("numpy not installed")
    rng = np.random.default_rng(1)
    for hkv, d, gqa in [(8, 128, 8), (4, 256, 8)]:
        for windowed in (False, True):
            keys, window = vp.check_case(16, windowed)
            start = vp.view_start(keys, 16, window, 8)
            n = keys - start
            b = vp.query_bounds(keys, 16, window, start)
            q = rng.standard_normal((16, hkv * gqa, d)).astype(np.float16).astype(np.float64)
            k = rng.standard_normal((n, hkv, d)).astype(np.float16).astype(np.float64)
            v = rng.standard_normal((n, hkv, d)).astype(np.float16).astype(np.float64)
            ref = attention_np(q, k, v, vp.band_mask(np, b, n), gqa, d ** -0.5)
            rmax = np.abs(ref).max()
            f16 = ref.astype(np.float16).astype(np.float64)
            assert vp.within(np.abs(f16 - ref).max(), rmax)
            wrong = [[(lo, min(hi + 1, n - 1)) for lo, hi in b]]  # sees one key too many
            if windowed:
                wrong += [[(lo + 1, hi) for lo, hi in b],  # one too few at the front
                          [(b[0][0], hi) for _, hi in b]]  # query 0's window start for all
            for w in wrong:
                out = attention_np(q, k, v, vp.band_mask(np, w, n), gqa, d ** -0.5)
                assert np.abs(out - ref).max() > 3 * (0.1 * rmax + 1e-3), (hkv, d, windowed)
    print("small check case: mask errors land far past the 10% flag")


class FakeRunner:
    """What run_all needs of a runner, without a GPU: cudnn's explicit mask fails (so the flat
    rows fall back to causal_lower_right and the window rows have no form), fi_prefill_e4m3 is
    off by 50% on the 131072-key rows, 1 µs per T."""

    def __init__(self, a, sticky_at=None):
        self.a = a
        self.opened = []
        self.closed = 0
        self.sticky_at = sticky_at
        self.calls = 0
        self.broken = False

    def env(self):
        return {"device": "fake"}

    def synchronize(self):
        if self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def check_form(self, peer, g, keys, window, t, form):
        if peer == "sdpa_cudnn_f16" and form == "mask":
            raise RuntimeError("No available kernel. Aborting execution.")
        return {"max_abs_err": 1e-3, "ref_max_abs": 1.0}

    def open(self, g, keys, window, group):
        self.opened.append((g, keys, window, group))
        return {"g": g, "keys": keys, "window": window}

    def close(self, ctx):
        self.closed += 1

    def measure(self, ctx, peer, t, form):
        self.calls += 1
        if self.sticky_at is not None and self.calls == self.sticky_at:
            self.broken = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        err = 0.5 if (peer == "fi_prefill_e4m3" and ctx["keys"] == 131072
                      and ctx["window"] is None) else 1e-3
        kv = ctx["keys"] if ctx["window"] is None else ctx["window"] + t - 1
        return {"us": float(t), "us_min": float(t), "method": "graph", "calls_per_graph": 16,
                "copies": 16, "max_abs_err": err, "ref_max_abs": 1.0, "kv_keys": kv,
                "bytes": kv * 1000}


ROW_KEYS = {"peer", "shape", "n_kv_heads", "head_dim", "gqa", "keys", "window", "queries", "us",
            "max_abs_err", "ok", "note"}


def run_fake(extra, **fake):
    return run_main(vp.main, FakeRunner, extra, **fake)


def test_run_loop_json():
    rc, res, fake = run_fake([])
    assert rc == 0 and res["env"] == {"device": "fake"} and "total_s" in res
    rows = res["rows"]
    checks = [r for r in rows if r.get("check")]
    timed = [r for r in rows if not r.get("check")]
    # 2 geometries x (flat, window) x 4 peers, less flash's window (no form to check)
    assert len(checks) == 2 * 2 * 4 - 2, len(checks)
    assert len(timed) == 8 * 4 * 7, len(timed)  # 8 points x 4 peers x T = 1 ... 64
    for r in rows:
        assert ROW_KEYS <= set(r), set(r) ^ ROW_KEYS
        assert r["shape"] == f"{r['n_kv_heads']}x{r['head_dim']} gqa {r['gqa']}"
    json.dumps(res)  # plain JSON all through
    by = {(r["peer"], r["shape"], r["keys"], r["window"], r["queries"]): r for r in timed}
    r = by[("sdpa_cudnn_f16", "8x128 gqa 8", 4096, None, 8)]
    assert r["us"] == 8.0 and r["ok"] is True and r["form"] == "lower_right"
    assert "causal_lower_right" in r["note"]
    c = next(x for x in checks if x["peer"] == "sdpa_cudnn_f16" and x["window"] is None)
    assert c["ok"] is True and c["form"] == "lower_right" and "No available kernel" in c["note"]
    assert c["keys"] == 72 and c["queries"] == 64 and c["us"] is None  # check_case(T max 64)
    c = next(x for x in checks if x["peer"] == "sdpa_cudnn_f16" and x["window"] == 8)
    assert c["ok"] is False and "form" not in c
    r = by[("sdpa_cudnn_f16", "4x256 gqa 8", 131072, 4096, 2)]
    assert r["us"] is None and "no mask form ran on the small case" in r["error"]
    assert r["ok"] is False
    r = by[("sdpa_flash_f16", "8x128 gqa 8", 131072, 4096, 16)]
    assert r["us"] is None and r["error"].startswith("skipped:") and "band mask" in r["error"]
    assert r["ok"] is None
    r = by[("sdpa_flash_f16", "8x128 gqa 8", 131072, None, 16)]
    assert r["ok"] is True and r["form"] == "lower_right"
    r = by[("fi_prefill_e4m3", "4x256 gqa 8", 131072, None, 4)]
    assert r["us"] == 4.0 and r["ok"] is False and "> 10%" in r["note"]
    r = by[("fi_prefill_f16", "4x256 gqa 8", 131072, 4096, 16)]
    assert r["ok"] is True and r["form"] == "custom_mask" and r["kv_keys"] == 4096 + 15
    assert "use_swa" in r["note"]
    # one cache per (point, group), the SDPA peers sharing theirs; none for a window's SDPA
    # group, where neither SDPA peer has a form
    assert len(fake.opened) == 2 * (3 * 3 + 2) and fake.closed == len(fake.opened)
    print(f"run loop: {len(rows)} rows, forms, fallbacks, flags and skips ok")


def test_budget_and_sticky():
    rc, res, fake = run_fake(["--budget-s", "0", "--geoms", "8x128x8"])
    assert rc == 0 and not fake.opened
    assert all(r["us"] is None and r["error"].startswith("skipped") for r in res["rows"])
    assert len([r for r in res["rows"] if not r.get("check")]) == 4 * 4 * 7
    rc, res, fake = run_fake(["--no-check", "--geoms", "8x128x8", "--keys", "4096",
                              "--window", "0"])
    assert rc == 0 and not any(r.get("check") for r in res["rows"])
    assert {r["form"] for r in res["rows"] if r["peer"] == "sdpa_cudnn_f16"} == {"mask"}
    rc, res, fake = run_fake(["--geoms", "8x128x8"], sticky_at=3)
    assert rc == 2 and "illegal memory access" in res["stopped"]
    bad = [r for r in res["rows"] if r.get("error") and "sticky" in r["error"]]
    assert len(bad) == 1 and fake.closed == len(fake.opened)
    print("time budget, --no-check and a sticky CUDA error ok")


def test_peers_import():
    pm, d = peers_or_skip()
    for name in ("Timer", "Ctx", "make_kv", "env_info"):
        assert hasattr(pm, name), name
    assert pm.Timer(None, vp.parse_args([])).copies_for(10) == 4096
    print(f"peers.py imported from {d}")


def need_torch():
    if torch is None:
        raise Skip("torch not installed")


def test_reference_vs_sdpa_math():
    need_torch()
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    for hkv, d, gqa, keys, t, window in [(8, 128, 8, 24, 16, None), (4, 256, 8, 40, 16, 8),
                                          (2, 64, 4, 100, 5, 17), (1, 32, 16, 9, 1, None)]:
        start = vp.view_start(keys, t, window, 8)
        n = keys - start
        b = vp.query_bounds(keys, t, window, start)
        m = vp.band_mask(torch, b, n)
        assert m.tolist() == vp.mask_rows(b, n)
        q = torch.randn(t, hkv * gqa, d, generator=g).half()
        k = torch.randn(n, hkv, d, generator=g)
        v = torch.randn(n, hkv, d, generator=g)
        ref = vp.reference_verify(torch, q, k, v, gqa, d ** -0.5, m)
        o = F.scaled_dot_product_attention(
            q.float().permute(1, 0, 2)[None], k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None],
            attn_mask=m, scale=d ** -0.5, enable_gqa=True)[0].permute(1, 0, 2)
        assert (o - ref).abs().max().item() < 1e-5, (hkv, d, gqa, keys, t, window)
    print("reference_verify == SDPA (math) with the band mask and GQA")


def test_sdpa_peer_on_cpu():
    """TorchRunner's SDPA code on the CPU (math backend in place of cuDNN/flash, a fake timer):
    slices, masks, layouts, the reference check, both forms; and the check catches a mask
    shifted by one."""
    need_torch()
    pm = vp.import_peers()
    saved = (pm.DEVICE, pm.Timer.run, vp.query_bounds)
    real_bounds = vp.query_bounds

    def fake_run(self, calls):
        calls[0]()
        return 5.0, "graph", 16, 4.0
    pm.DEVICE = "cpu"
    pm.Timer.run = fake_run
    try:
        a = vp.parse_args(["--rotate-mb", "1", "--queries", "1,4,16"])
        r = vp.TorchRunner(torch, pm, a)
        r.sdpa_backends = {k: "MATH" for k in r.sdpa_backends}
        r.synchronize = lambda: None
        assert r.gqa_kw is True
        for g in [(8, 128, 8), (4, 256, 8)]:
            for windowed, forms in ((False, ["mask", "lower_right"]), (True, ["mask"])):
                keys, window = vp.check_case(16, windowed)
                for form in forms:
                    e = r.check_form("sdpa_cudnn_f16", g, keys, window, 16, form)
                    assert e["max_abs_err"] < 1e-2, (g, form, e)
        g = (2, 64, 4)
        for keys, window in ((100, None), (300, 64)):
            ctx = r.open(g, keys, window, ("HND", "f16"))
            for t in (1, 4, 16):
                f = r.measure(ctx, "sdpa_flash_f16" if window is None else "sdpa_cudnn_f16", t,
                              "lower_right" if window is None else "mask")
                want = keys if window is None else keys - vp.view_start(keys, t, window, 8)
                assert f["kv_keys"] == want and f["bytes"] == want * 2 * 64 * 2 * 2
                assert f["us"] == 5.0 and f["max_abs_err"] < 1e-2, f
            r.close(ctx)
        # a peer whose mask lets each query see one key too many: the small check sees it

        def one_late(keys, t, window, start=0):
            b = real_bounds(keys, t, window, start)
            return [(lo, hi + 1) for lo, hi in b[:-1]] + b[-1:]
        vp.query_bounds = one_late
        keys, window = vp.check_case(16, False)
        ctx = r._ctx((8, 128, 8), keys, window, vp.OneCopy())
        calls, out0, lo, hi, start, _ = r._build(ctx, "sdpa_cudnn_f16", 16, "mask")
        vp.query_bounds = real_bounds
        e = r._error(ctx, out0, 16, lo, hi, start)
        assert not vp.within(e["max_abs_err"], e["ref_max_abs"]), e
    finally:
        pm.DEVICE, pm.Timer.run, vp.query_bounds = saved
    print("SDPA peer code on the CPU: both forms, windows, bytes; a shifted mask is flagged")


if __name__ == "__main__":
    run_tests([test_bounds_and_masks, test_band_mask_numpy, test_pack_mask, test_forms,
               test_args, test_small_check_catches_mask_errors, test_run_loop_json,
               test_budget_and_sticky, test_peers_import, test_reference_vs_sdpa_math,
               test_sdpa_peer_on_cpu])
