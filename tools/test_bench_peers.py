#!/usr/bin/env python3
"""CPU checks of tools/bench-peers (no GPU, standard library only): synthetic JSON of
`kvlayer bench --json` and of peers.py (verify_peers.py, batch_peers.py) go in; the decode table
(fastest peer, ratio, floor and its source, windowed rows), the every-peer table, the verify and
batch decode tables, the accuracy table, the missing-peers and missing-matplotlib paths come
out.

    python3 tools/test_bench_peers.py        (exit 0: all passed)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "bench-peers")
sys.path.insert(0, HERE)
from tool_module import load_tool  # noqa: E402

bp = load_tool("bench-peers")


def kv_row(name, n_kv, hd, gqa, keys, us, window=None, floor=None, queries=None):
    view = window + (queries or 1) - 1 if window else keys
    nbytes = float(view * n_kv * (hd // 32) * 58 + 2 * (queries or 1) * n_kv * gqa * hd * 4)
    r = {"name": name, "shape": f"{n_kv}x{hd} gqa {gqa}", "n_kv_heads": n_kv, "head_dim": hd,
         "gqa": gqa, "keys": keys, "window": window, "queries": queries, "us": us,
         "bytes": nbytes, "gbs": nbytes / us / 1e3,
         "pct_ceiling": 100.0 * nbytes / us / 1e3 / 4500.0}
    if floor is not None:
        r.update(floor_us=floor, pct_floor=100.0 * floor / us)
    return r


def synthetic_kvlayer():
    res = [{"name": "stream_read", "shape": "2 GiB", "n_kv_heads": 0, "head_dim": 0, "gqa": 0,
            "keys": 0, "window": None, "us": 476.6, "bytes": 2147483648.0, "gbs": 4506.0,
            "pct_ceiling": 100.0, "floor_us": 475.0, "pct_floor": 99.7}]
    # (geometry, keys, window): graph µs; eager = graph + 4, back to back = graph + 1,
    # host-len = graph + 5
    points = [((8, 128, 8), 1024, None, 8.0), ((8, 128, 8), 4096, None, 12.0),
              ((8, 128, 8), 131072, 4096, 11.0),
              ((1, 128, 16), 1024, None, 7.0), ((1, 128, 16), 4096, None, 9.0)]
    for (h, d, g), keys, window, us in points:
        dc = "decode_dcw" if window else "decode_dc"
        res.append(kv_row("decode", h, d, g, keys, us + 5, window, floor=6.5))
        res.append(kv_row(dc, h, d, g, keys, us + 4, window, floor=6.5))
        res.append(kv_row(dc + "_graph", h, d, g, keys, us, window, floor=6.5))
        res.append(kv_row(dc + "_b2b", h, d, g, keys, us + 1, window, floor=6.5))
    acc = []
    for data in ("normal", "k_outliers"):
        for t in (1, 8):
            for fmt, src, mx, rel in (("q8_0/q5_1", "kvlayer GPU decode_dc" if t == 1 else
                                       "kvlayer GPU decode_rows_dc", 1.5e-4, 3.1e-3),
                                      ("e4m3", "host emulation", 1.3e-3, 3.8e-2),
                                      ("f16", "host emulation", 1.5e-5, 3.6e-4)):
                scale = (10 if data == "k_outliers" else 1) * (2 if t == 8 else 1)
                row = {"data": data, "shape": "8x128 gqa 8", "n_kv_heads": 8, "head_dim": 128,
                       "gqa": 8, "keys": 4096, "format": fmt, "source": src,
                       "max_abs_err": mx * scale, "rms_err": rel * 0.026 * scale,
                       "rel_rms_err": rel * scale, "ref_rms": 0.026, "ref_max_abs": 0.12}
                if t == 8:  # a decode row leaves "queries" out, as JSON from before T = 8 rows
                    row["queries"] = t
                acc.append(row)
    return {"date": "2026-12-02", "gpu": "NVIDIA H200", "ceiling_gbs": 4506.0, "reps": 50,
            "wall_s": 31.0, "results": res, "accuracy": acc,
            "accuracy_method": "synthetic method text",
            "outlier_channels": "k_outliers: synthetic channels"}


def peer_row(geom, keys, peer, us=None, **extra):
    h, d, g = geom
    r = {"geometry": f"{h}x{d}x{g}", "n_kv_heads": h, "head_dim": d, "gqa": g,
         "n_q_heads": h * g, "keys": keys, "peer": peer, "us": us, "bytes": 1000}
    if us is not None:
        r.update(method="graph", calls_per_graph=16, max_abs_err=1e-3, ref_max_abs=0.1)
    r.update(extra)
    return r


def synthetic_peers():
    a, b = (8, 128, 8), (1, 128, 16)
    rows = [
        # 8x128x8, 1K: xqa fastest (6.0 < kvlayer 8.0) -> ratio 0.75
        peer_row(a, 1024, "floor_q8q5", 2.3), peer_row(a, 1024, "sdpa_cudnn_f16", 7.8),
        peer_row(a, 1024, "fi_tc_e4m3", 13.6), peer_row(a, 1024, "xqa_e4m3", 6.0),
        peer_row(a, 1024, "xqa_int8", error="RuntimeError: boom"),
        # 4K: a suspect peer is fastest on paper but must not count; cudnn 18.0 / 12.0 = 1.50
        peer_row(a, 4096, "floor_q8q5", 3.1), peer_row(a, 4096, "sdpa_cudnn_f16", 18.0),
        peer_row(a, 4096, "fi_tc_e4m3", 19.5),
        peer_row(a, 4096, "xqa_e4m3", 1.0,
                 suspect="output differs from the fp32 reference by >10%"),
        peer_row(a, 4096, "fi_batch_f16", 25.0, method="eager"),
        # 1x128x16, 1K: fi_tc fastest 14.0 / 7.0 = 2.00; 4K: no floor row, budget-skipped rows
        peer_row(b, 1024, "floor_q8q5", 1.9), peer_row(b, 1024, "sdpa_cudnn_f16", 16.0),
        peer_row(b, 1024, "fi_tc_e4m3", 14.0),
        peer_row(b, 4096, "sdpa_cudnn_f16", 27.0), peer_row(b, 4096, "fi_tc_e4m3", 18.0),
        {"geometry": "1x128x16", "keys": 4096, "peer": "xqa_e4m3", "us": None,
         "error": "skipped: time budget"},
    ]
    return {"env": {"device": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0+cu130",
                    "flashinfer-python": "0.7.4+kvpeers", "triton": "3.6.0"},
            "args": {}, "rows": rows, "total_s": 41.5}


# kvlayer's verify µs per (keys, window) and T, for 8x128 gqa 8; T = 1 decode: 12.0 at 4096,
# 85.0 at 131072 (added by synthetic_verify_kvlayer), 11.0 for the window
VERIFY_US = {(4096, None): {1: 12.5, 8: 14.0, 16: 19.0},
             (131072, None): {1: 86.0, 8: 95.0, 16: 120.0},
             (131072, 4096): {1: 11.5, 8: 13.0, 16: 15.0}}


def synthetic_verify_kvlayer():
    kv = synthetic_kvlayer()
    res = kv["results"]
    res.append(kv_row("decode_dc_graph", 8, 128, 8, 131072, 85.0, floor=60.0))
    for (keys, window), by_t in VERIFY_US.items():
        for t, us in by_t.items():
            res.append(kv_row("verify_dcw_graph" if window else "verify_dc_graph", 8, 128, 8,
                              keys, us, window, floor=6.0, queries=t))
    return kv


def vrow(keys, window, t, peer, us=None, ok=True, **extra):
    note = {"sdpa_cudnn_f16": "explicit boolean mask",
            "sdpa_flash_f16": "causal_lower_right (bottom-right causal)",
            "fi_prefill_f16": "causal=True (bottom-right)" if window is None else
                              "packed custom mask (window_left needs a use_swa module)",
            "fi_prefill_e4m3": "causal=True (bottom-right)"}[peer]
    r = {"peer": peer, "shape": "8x128 gqa 8", "n_kv_heads": 8, "head_dim": 128, "gqa": 8,
         "keys": keys, "window": window, "queries": t, "us": us, "max_abs_err": None,
         "ok": None, "note": ""}
    if us is not None:
        r.update(max_abs_err=1e-3, ref_max_abs=1.0, note=note, method="graph",
                 form="mask" if peer == "sdpa_cudnn_f16" else "x")
    if us is not None or extra.get("check"):
        r["ok"] = ok
    r.update(extra)
    return r


def synthetic_verify_peers():
    w = 4096
    rows = [
        vrow(24, None, 16, "sdpa_cudnn_f16", check=True, ok=True, note="mask check: mask ok",
             max_abs_err=1e-3),
        vrow(40, 8, 16, "sdpa_cudnn_f16", check=True, ok=False,
             note="mask check (small case): mask: RuntimeError: No available kernel"),
        # 4096, T = 8: the flagged e4m3 row (10.0) must not be the fastest: 18.2 / 14.0 = 1.30
        vrow(4096, None, 8, "sdpa_cudnn_f16", 30.0), vrow(4096, None, 8, "sdpa_flash_f16", 20.0),
        vrow(4096, None, 8, "fi_prefill_f16", 18.2),
        vrow(4096, None, 8, "fi_prefill_e4m3", 10.0, ok=False,
             note="causal=True (bottom-right); output off the fp32 reference by > 10%"),
        vrow(4096, None, 1, "sdpa_cudnn_f16", error="RuntimeError: No available kernel"),
        vrow(4096, None, 1, "sdpa_flash_f16", 16.0),  # 16.0 / 12.5 = 1.28
        vrow(4096, None, 16, "sdpa_flash_f16", 25.0),  # 25.0 / 19.0 = 1.32
        vrow(131072, None, 1, "sdpa_cudnn_f16", 140.0), vrow(131072, None, 1, "sdpa_flash_f16", 130.0),
        vrow(131072, None, 1, "fi_prefill_e4m3", 70.0),  # 70 / 86 = 0.81
        vrow(131072, None, 8, "fi_prefill_e4m3", 80.0),  # 80 / 95 = 0.84
        vrow(131072, None, 16, "fi_prefill_e4m3", 90.0),  # 90 / 120 = 0.75: the lowest
        vrow(131072, w, 1, "sdpa_cudnn_f16", 30.0), vrow(131072, w, 1, "fi_prefill_f16", 20.0),
        vrow(131072, w, 1, "sdpa_flash_f16",
             error="skipped: the flash backend takes no explicit mask (only causal_lower_right), "
                   "and a window needs a band mask"),
        vrow(131072, w, 8, "sdpa_cudnn_f16", 31.0), vrow(131072, w, 8, "fi_prefill_f16", 21.0),
        vrow(131072, w, 16, "sdpa_cudnn_f16", error="skipped: time budget"),
    ]
    return {"env": {"device": "NVIDIA H200", "torch": "2.11.0+cu130",
                    "flashinfer_prefill": "imported"}, "rows": rows, "total_s": 52.0}


def table(text, title):
    """The rows of the markdown table under '## title', as lists of cells."""
    lines = text.split("\n")
    i = lines.index("## " + title)
    rows = []
    for ln in lines[i + 1:]:
        if ln.startswith("## "):
            break
        if ln.startswith("|") and not ln.startswith("|---"):
            rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows[0], rows[1:]


def by_point(rows):
    return {(r[0], r[1], r[2]): r for r in rows}


def test_join():
    joined = bp.join(synthetic_kvlayer(), synthetic_peers())
    j = {(x["geometry"], x["keys"], x["window"]): x for x in joined}
    assert len(joined) == 5, len(joined)
    x = j[((8, 128, 8), 1024, None)]
    assert x["fastest_peer"] == "xqa_e4m3" and abs(x["ratio"] - 0.75) < 1e-12, x
    assert x["graph_us"] == 8.0 and x["eager_us"] == 12.0 and x["host_len_us"] == 13.0
    assert x["b2b_us"] == 9.0
    assert x["floor_source"] == "peers" and x["floor_us"] == 2.3
    assert abs(x["gbs"] - x["bytes"] / 8.0 / 1e3) < 1e-9
    x = j[((8, 128, 8), 4096, None)]
    assert x["fastest_peer"] == "sdpa_cudnn_f16" and abs(x["ratio"] - 1.5) < 1e-12, x
    # the window row reads 4096 keys: the peers at 4096 stand in
    w = j[((8, 128, 8), 131072, 4096)]
    assert w["peer_keys"] == 4096 and w["fastest_peer"] == "sdpa_cudnn_f16"
    assert abs(w["ratio"] - 18.0 / 11.0) < 1e-12 and w["floor_us"] == 3.1
    x = j[((1, 128, 16), 4096, None)]
    assert x["floor_source"] == "kvlayer" and x["floor_us"] == 6.5
    assert x["fastest_peer"] == "fi_tc_e4m3" and abs(x["ratio"] - 2.0) < 1e-12
    # without peers: no fastest, floors from kvlayer
    for x in bp.join(synthetic_kvlayer(), None):
        assert x["fastest_peer"] is None and x["ratio"] is None and x["floor_source"] == "kvlayer"
    print("join: fastest peer, ratio, floors, windows ok")


def run_main(tmp, peers=True, extra=()):
    kvp = os.path.join(tmp, "kvlayer.json")
    with open(kvp, "w") as f:
        json.dump(synthetic_kvlayer(), f)
    args = ["--kvlayer", kvp, "--out", os.path.join(tmp, "out")]
    if peers:
        pp = os.path.join(tmp, "peers.json")
        with open(pp, "w") as f:
            json.dump(synthetic_peers(), f)
        args += ["--peers", pp]
    assert bp.main(args + list(extra)) == 0
    with open(os.path.join(tmp, "out", "RESULTS.md")) as f:
        return f.read()


def test_results_md():
    with tempfile.TemporaryDirectory() as tmp:
        text = run_main(tmp, extra=["--no-plot"])
    head, rows = table(text, "Decode: kvlayer against the fastest peer")
    assert head == ["geometry", "keys", "window", "kvlayer graph µs", "eager µs", "b2b µs", "MB",
                    "GB/s", "floor µs", "% floor", "fastest peer", "peer µs",
                    "peer / kvlayer"], head
    r = by_point(rows)
    assert r[("8×128 gqa 8", "1024", "—")][10:] == ["xqa_e4m3", "6.0", "0.75"]
    assert r[("8×128 gqa 8", "1024", "—")][3:6] == ["8.0", "12.0", "9.0"]
    assert r[("8×128 gqa 8", "1024", "—")][8:10] == ["2.3", "28.7"]  # 2.3 / 8.0
    assert r[("8×128 gqa 8", "4096", "—")][10:] == ["sdpa_cudnn_f16", "18.0", "1.50"]
    assert r[("8×128 gqa 8", "131072", "4096")][10:] == ["sdpa_cudnn_f16", "18.0", "1.64"]
    assert r[("1×128 gqa 16", "4096", "—")][8] == "6.5†"
    assert r[("1×128 gqa 16", "1024", "—")][10:] == ["fi_tc_e4m3", "14.0", "2.00"]
    head, rows = table(text, "Every peer (µs per call)")
    assert head[:4] == ["geometry", "keys", "window", "kvlayer graph"]
    assert head[4:] == ["sdpa_cudnn_f16", "fi_batch_f16", "fi_tc_e4m3", "xqa_e4m3", "xqa_int8",
                        "floor_q8q5"], head
    r = {(x[0], x[1], x[2]): dict(zip(head, x)) for x in rows}
    assert r[("8×128 gqa 8", "4096", "—")]["xqa_e4m3"] == "1.0!"
    assert r[("8×128 gqa 8", "4096", "—")]["fi_batch_f16"] == "25.0e"
    assert r[("8×128 gqa 8", "1024", "—")]["xqa_int8"] == "err"
    assert r[("1×128 gqa 16", "4096", "—")]["xqa_e4m3"] == "—"  # skipped by the budget
    head, rows = table(text, "Accuracy")
    assert head[:5] == ["data", "geometry", "keys", "T", "ref RMS"]
    assert head[5:] == ["q8_0/q5_1 max abs", "q8_0/q5_1 rel RMS", "e4m3 max abs",
                        "e4m3 rel RMS", "f16 max abs", "f16 rel RMS"], head
    assert len(rows) == 4, rows
    assert rows[0][:4] == ["normal", "8×128 gqa 8", "4096", "1"]
    assert rows[0][5:] == ["1.50e-04", "3.10e-03", "1.30e-03", "3.80e-02", "1.50e-05", "3.60e-04"]
    assert rows[1][:4] == ["normal", "8×128 gqa 8", "4096", "8"] and rows[1][6] == "6.20e-03"
    assert rows[2][0] == "k_outliers" and rows[2][6] == "3.10e-02"
    assert "q8_0/q5_1: kvlayer GPU decode_dc, kvlayer GPU decode_rows_dc;" in text
    assert "synthetic method text" in text and "k_outliers: synthetic channels." in text
    assert "GPU: NVIDIA H200, driver 580.159.04" in text and "FlashInfer 0.7.4+kvpeers" in text
    _, rows = table(text, "Every kvlayer row")
    assert rows[0][0] == "stream_read" and len(rows) == 21, len(rows)  # 1 + 5 points × 4 rows
    _, rows = table(text, "Peer rows without a time, or flagged")
    assert {r[2] for r in rows} == {"xqa_int8", "xqa_e4m3"} and len(rows) == 3
    print("RESULTS.md: decode, every-peer, accuracy and kvlayer tables ok")


def test_no_peers_no_matplotlib():
    saved = sys.modules.get("matplotlib", "absent")
    sys.modules["matplotlib"] = None  # import matplotlib raises ImportError
    try:
        with tempfile.TemporaryDirectory() as tmp:
            text = run_main(tmp, peers=False)
            assert not os.path.exists(os.path.join(tmp, "out", "decode.png"))
    finally:
        if saved == "absent":
            del sys.modules["matplotlib"]
        else:
            sys.modules["matplotlib"] = saved
    assert "**No peers JSON**" in text
    _, rows = table(text, "Decode: kvlayer against the fastest peer")
    assert all(r[10:] == ["—", "—", "—"] and r[8].endswith("†") for r in rows), rows
    print("no peers, no matplotlib: RESULTS.md written, plot skipped")


def test_verify():
    joined = bp.join_verify(synthetic_verify_kvlayer(), synthetic_verify_peers())
    assert len(joined) == 9, len(joined)
    j = {(x["keys"], x["window"], x["queries"]): x for x in joined}
    x = j[(4096, None, 8)]
    assert x["decode_us"] == 12.0 and abs(x["t_ratio"] - 14.0 / 12.0) < 1e-12
    assert x["fastest_peer"] == "fi_prefill_f16" and abs(x["ratio"] - 18.2 / 14.0) < 1e-12
    x = j[(4096, None, 1)]
    assert x["fastest_peer"] == "sdpa_flash_f16" and abs(x["ratio"] - 16.0 / 12.5) < 1e-12
    x = j[(131072, None, 16)]
    assert x["decode_us"] == 85.0 and abs(x["t_ratio"] - 120.0 / 85.0) < 1e-12
    assert x["fastest_peer"] == "fi_prefill_e4m3" and abs(x["ratio"] - 0.75) < 1e-12
    x = j[(131072, 4096, 8)]  # the window's T = 1 is the decode_dcw_graph row
    assert x["decode_us"] == 11.0 and abs(x["t_ratio"] - 13.0 / 11.0) < 1e-12
    assert x["fastest_peer"] == "fi_prefill_f16" and abs(x["ratio"] - 21.0 / 13.0) < 1e-12
    x = j[(131072, 4096, 16)]
    assert x["fastest_peer"] is None and x["ratio"] is None and x["peers"]
    # without a verify peers file: kvlayer's columns only
    for x in bp.join_verify(synthetic_verify_kvlayer(), None):
        assert x["fastest_peer"] is None and x["t_ratio"] is not None

    with tempfile.TemporaryDirectory() as tmp:
        kvp, vpp = os.path.join(tmp, "kv.json"), os.path.join(tmp, "vp.json")
        with open(kvp, "w") as f:
            json.dump(synthetic_verify_kvlayer(), f)
        with open(vpp, "w") as f:
            json.dump(synthetic_verify_peers(), f)
        out = os.path.join(tmp, "out")
        assert bp.main(["--kvlayer", kvp, "--verify-peers", vpp, "--out", out,
                        "--no-plot"]) == 0
        with open(os.path.join(out, "RESULTS.md")) as f:
            text = f.read()
        assert bp.main(["--kvlayer", kvp, "--out", out, "--no-plot"]) == 0
        with open(os.path.join(out, "RESULTS.md")) as f:
            bare = f.read()
    head, rows = table(text, "Verify decode (SPEC §11)")
    assert head == ["geometry", "keys", "window", "T", "kvlayer µs", "T=1 decode µs", "× T=1",
                    "sdpa_cudnn_f16", "sdpa_flash_f16", "fi_prefill_f16", "fi_prefill_e4m3",
                    "fastest peer", "peer µs", "peer / kvlayer"], head
    r = {(x[1], x[2], x[3]): dict(zip(head, x)) for x in rows}
    x = r[("4096", "—", "8")]
    assert [x[k] for k in ("kvlayer µs", "T=1 decode µs", "× T=1")] == ["14.0", "12.0", "1.17"]
    assert x["fi_prefill_e4m3"] == "10.0!" and x["sdpa_cudnn_f16"] == "30.0"
    assert [x["fastest peer"], x["peer µs"], x["peer / kvlayer"]] == ["fi_prefill_f16", "18.2",
                                                                       "1.30"]
    assert r[("4096", "—", "1")]["sdpa_cudnn_f16"] == "err"
    assert r[("4096", "—", "16")]["× T=1"] == "1.58"
    x = r[("131072", "4096", "1")]
    assert x["sdpa_flash_f16"] == "—" and x["× T=1"] == "1.05" and x["peer / kvlayer"] == "1.74"
    x = r[("131072", "4096", "16")]
    assert x["sdpa_cudnn_f16"] == "—" and x["fastest peer"] == "—" and x["× T=1"] == "1.36"
    assert r[("131072", "—", "16")]["peer / kvlayer"] == "0.75"
    summary = ("T = 8 within 1.25× of the T = 1 decode in 3 of 3 rows (at 131072 keys: 8×128 "
               "gqa 8 1.12×); T = 16 within 1.50× of the T = 1 decode in 2 of 3 rows (at "
               "131072 keys: 8×128 gqa 8 1.41×); kvlayer ≥ 1.10× the fastest verifying peer in "
               "5 of 8 rows, ahead in 5; lowest ratio 0.75 (8×128 gqa 8, 131072 keys, T = 16, "
               "against fi_prefill_e4m3).")
    assert summary in text.split("\n"), [ln for ln in text.split("\n") if "T = 8" in ln]
    assert ("Mask forms: sdpa_cudnn_f16 (flat): explicit boolean mask; sdpa_cudnn_f16 (window): "
            "explicit boolean mask; sdpa_flash_f16 (flat): causal_lower_right") in text
    assert "Not run: sdpa_flash_f16: the flash backend takes no explicit mask" in text
    _, rows = table(text, "Verify peer rows without a time, or flagged")
    assert [(x[1], x[3], x[4]) for x in rows] == [("40 (check)", "16", "sdpa_cudnn_f16"),
                                                  ("4096", "8", "fi_prefill_e4m3"),
                                                  ("4096", "1", "sdpa_cudnn_f16")], rows
    _, rows = table(text, "Every kvlayer row")
    assert "verify_dc_graph T8" in [x[0] for x in rows]
    assert "Took: kvlayer bench 31 s, verify_peers.py 52 s." in text
    # the decode tables do not change with the verify rows beside them
    assert table(text, "Decode: kvlayer against the fastest peer")[1][0][:4] == [
        "8×128 gqa 8", "1024", "—", "8.0"]
    head, rows = table(bare, "Verify decode (SPEC §11)")
    assert "**No verify peers JSON**" in bare and head[7:] == ["fastest peer", "peer µs",
                                                              "peer / kvlayer"]
    assert all(x[7:] == ["—", "—", "—"] for x in rows) and len(rows) == 9
    assert "## Verify decode" not in run_main_text_without_verify()
    print("verify: T / T=1, every verifying peer, the fastest, ratios, summary, flags ok")


# kvlayer's batch_dc_graph µs and its own floor per (case, B); total keys per point
BATCH_KEYS = {("4k", 8): 32768, ("4k", 32): 131072, ("4k", 128): 524288, ("log", 8): 52793,
              ("log", 32): 214215, ("log", 128): 857635, ("128k", 8): 1048576}
BATCH_US = {("4k", 8): 30.0, ("4k", 32): 100.0, ("4k", 128): 380.0, ("log", 8): 45.0,
            ("log", 32): 160.0, ("log", 128): 600.0, ("128k", 8): 700.0}


def synthetic_batch_kvlayer():
    kv = synthetic_kvlayer()
    for (case, b), us in BATCH_US.items():
        keys = BATCH_KEYS[(case, b)]
        nbytes = float(keys * 8 * 4 * 58 + 2 * b * 64 * 128 * 4)
        kv["results"].append({
            "name": "batch_dc_graph", "shape": "8x128 gqa 8", "n_kv_heads": 8, "head_dim": 128,
            "gqa": 8, "keys": keys, "window": None, "queries": None, "batch": b, "case": case,
            "us": us, "bytes": nbytes, "gbs": nbytes / us / 1e3,
            "pct_ceiling": 100.0 * nbytes / us / 1e3 / 4500.0, "floor_us": 30.0,
            "pct_floor": 100.0 * 30.0 / us})
    return kv


def brow(case, b, peer, us=None, ok=True, **extra):
    r = {"peer": peer, "case": case, "batch": b, "keys": BATCH_KEYS.get((case, b), 4096 * b),
         "n_kv_heads": 8, "head_dim": 128, "gqa": 8, "n_q_heads": 64, "page_size": 32, "us": us,
         "max_abs_err": None, "ok": None, "note": ""}
    if us is not None:
        r.update(method="graph", calls_per_graph=16, copies=1)
        if peer != "floor_q8q5":
            r.update(max_abs_err=1e-3, ref_max_abs=1.0, ok=ok)
    r.update(extra)
    return r


def synthetic_batch_peers():
    rows = [
        # 4k B=8: xqa_e4m3 fastest, 36 / 30 = 1.20; floor 20 / 30 = 66.7%
        brow("4k", 8, "floor_q8q5", 20.0), brow("4k", 8, "fi_cc_f16", 60.0),
        brow("4k", 8, "fi_cc_e4m3", 40.0), brow("4k", 8, "fi_tc_f16", 55.0),
        brow("4k", 8, "fi_tc_e4m3", error="RuntimeError: JIT is disabled; module not prebuilt"),
        brow("4k", 8, "xqa_f16", 50.0), brow("4k", 8, "xqa_e4m3", 36.0),
        # 4k B=32: flagged rows do not count: fi_cc_e4m3 120 / 100 = 1.20; floor 88%
        brow("4k", 32, "floor_q8q5", 88.0), brow("4k", 32, "fi_cc_e4m3", 120.0),
        brow("4k", 32, "xqa_e4m3", 105.0, ok=False,
             note="output differs from the fp32 reference by >10%"),
        brow("4k", 32, "fi_tc_e4m3", 110.0,
             suspect="output differs from the fp32 reference by >10%"),
        # 4k B=128: 400 / 380 = 1.05, the lowest; floor 330 / 380 = 86.8%
        brow("4k", 128, "floor_q8q5", 330.0), brow("4k", 128, "xqa_e4m3", 400.0),
        # log B=8: no floor row: kvlayer's own (30 / 45 = 66.7%, marked); 50 / 45 = 1.11
        brow("log", 8, "fi_tc_e4m3", 50.0),
        # log B=32: floor 128 / 160 = 80.0% (below 85%); 200 / 160 = 1.25
        brow("log", 32, "floor_q8q5", 128.0), brow("log", 32, "xqa_e4m3", 200.0),
        # log B=128: 90%, a budget-skipped row; 720 / 600 = 1.20
        brow("log", 128, "floor_q8q5", 540.0), brow("log", 128, "xqa_e4m3", 720.0),
        brow("log", 128, "fi_tc_e4m3", error="skipped: time budget"),
        # 128k B=8: 650 / 700 = 92.9%; 910 / 700 = 1.30
        brow("128k", 8, "floor_q8q5", 650.0), brow("128k", 8, "xqa_e4m3", 910.0),
        # a point only the peers have
        brow("4k", 64, "xqa_e4m3", 210.0),
    ]
    return {"env": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
                    "flashinfer-python": "0.7.4+kvpeers", "flashinfer_decode": "imported"},
            "rows": rows, "total_s": 63.0}


def test_batch():
    joined = bp.join_batch(synthetic_batch_kvlayer(), synthetic_batch_peers())
    assert [(j["case"], j["batch"]) for j in joined] == list(BATCH_US) + [("4k", 64)]
    j = {(x["case"], x["batch"]): x for x in joined}
    x = j[("4k", 8)]
    assert x["fastest_peer"] == "xqa_e4m3" and abs(x["ratio"] - 1.2) < 1e-12
    assert x["floor_source"] == "peers" and abs(x["pct_floor"] - 200 / 3) < 1e-9
    x = j[("4k", 32)]
    assert x["fastest_peer"] == "fi_cc_e4m3" and abs(x["ratio"] - 1.2) < 1e-12
    x = j[("log", 8)]
    assert x["floor_source"] == "kvlayer" and x["floor_us"] == 30.0
    assert x["fastest_peer"] == "fi_tc_e4m3" and abs(x["ratio"] - 50 / 45) < 1e-12
    x = j[("4k", 64)]
    assert x["us"] is None and x["ratio"] is None and x["fastest_peer"] == "xqa_e4m3"
    assert x["keys"] == 4096 * 64 and x["bytes"] is None
    for x in bp.join_batch(synthetic_batch_kvlayer(), None):
        assert x["fastest_peer"] is None and x["floor_source"] == "kvlayer"
    assert bp.join_batch(synthetic_kvlayer(), None) == []

    with tempfile.TemporaryDirectory() as tmp:
        kvp, bpp = os.path.join(tmp, "kv.json"), os.path.join(tmp, "bp.json")
        with open(kvp, "w") as f:
            json.dump(synthetic_batch_kvlayer(), f)
        with open(bpp, "w") as f:
            json.dump(synthetic_batch_peers(), f)
        out = os.path.join(tmp, "out")
        p = subprocess.run([sys.executable, SCRIPT, "--kvlayer", kvp, "--batch-peers", bpp,
                            "--out", out, "--no-plot"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        with open(os.path.join(out, "RESULTS.md")) as f:
            text = f.read()
        assert bp.main(["--kvlayer", kvp, "--out", out, "--no-plot"]) == 0
        with open(os.path.join(out, "RESULTS.md")) as f:
            bare = f.read()
    head, rows = table(text, "Batch decode")
    assert head == ["case", "B", "keys", "kvlayer µs", "MB", "GB/s", "floor µs", "% floor",
                    "fi_cc_f16", "fi_cc_e4m3", "fi_tc_f16", "fi_tc_e4m3", "xqa_f16", "xqa_e4m3",
                    "fastest peer", "peer µs", "peer / kvlayer"], head
    r = {(x[0], x[1]): dict(zip(head, x)) for x in rows}
    assert len(rows) == 8
    x = r[("4k", "8")]
    assert [x[k] for k in ("keys", "kvlayer µs", "MB", "floor µs", "% floor")] == [
        "32768", "30.0", "61.3", "20.0", "66.7"], x
    assert x["GB/s"] == f"{(32768 * 8 * 4 * 58 + 2 * 8 * 64 * 128 * 4) / 30.0 / 1e3:.0f}"
    assert x["fi_tc_e4m3"] == "err" and x["xqa_e4m3"] == "36.0"
    assert [x["fastest peer"], x["peer µs"], x["peer / kvlayer"]] == ["xqa_e4m3", "36.0", "1.20"]
    x = r[("4k", "32")]
    assert x["xqa_e4m3"] == "105.0!" and x["fi_tc_e4m3"] == "110.0!" and x["% floor"] == "88.0"
    assert [x["fastest peer"], x["peer / kvlayer"]] == ["fi_cc_e4m3", "1.20"]
    x = r[("log", "8")]
    assert x["floor µs"] == "30.0†" and x["% floor"] == "66.7" and x["peer / kvlayer"] == "1.11"
    assert x["keys"] == "52793"
    x = r[("log", "128")]
    assert x["fi_tc_e4m3"] == "—" and x["% floor"] == "90.0" and x["peer / kvlayer"] == "1.20"
    x = r[("4k", "64")]
    assert x["kvlayer µs"] == "—" and x["xqa_e4m3"] == "210.0" and x["peer / kvlayer"] == "—"
    assert r[("128k", "8")]["keys"] == "1048576" and r[("128k", "8")]["peer / kvlayer"] == "1.30"
    summary = ("kvlayer ≥ 1.10× the fastest batch peer in 6 of 7 rows, ahead in 7; lowest ratio "
               "1.05 (4k, B = 128, against xqa_e4m3); ≥ 85% of the floor at B ≥ 32 in 3 of 4 "
               "rows; lowest 80.0% (log, B = 32).")
    assert summary in text.split("\n"), [ln for ln in text.split("\n") if "batch peer" in ln]
    assert ("Batch peers' GPU: NVIDIA H100 80GB HBM3, FlashInfer 0.7.4+kvpeers. **kvlayer ran "
            "on NVIDIA H200: the ratios compare two machines**.") in text
    assert "Took: kvlayer bench 31 s, batch_peers.py 63 s." in text
    _, rows = table(text, "Batch peer rows without a time, or flagged")
    assert [(x[0], x[1], x[2]) for x in rows] == [("4k", "8", "fi_tc_e4m3"),
                                                  ("4k", "32", "xqa_e4m3"),
                                                  ("4k", "32", "fi_tc_e4m3")], rows
    _, rows = table(text, "Every kvlayer row")
    assert "batch_dc_graph B8 4k" in [x[0] for x in rows]
    assert "batch_dc_graph B128 log" in [x[0] for x in rows]
    # the other tables do not change with the batch rows beside them
    assert table(text, "Decode: kvlayer against the fastest peer")[1][0][:4] == [
        "8×128 gqa 8", "1024", "—", "8.0"]
    assert "## Verify decode" not in text
    head, rows = table(bare, "Batch decode")
    assert "**No batch peers JSON**" in bare and head[8:] == ["fastest peer", "peer µs",
                                                             "peer / kvlayer"]
    assert len(rows) == 7 and all(x[8:] == ["—", "—", "—"] and x[6].endswith("†") for x in rows)
    assert "## Batch decode" not in run_main_text_without_verify()
    # the same GPU: no warning
    kv = synthetic_batch_kvlayer()
    kv["gpu"] = "NVIDIA H100 80GB HBM3"
    text, _ = bp.render(kv, None, None, synthetic_batch_peers())
    assert "Batch peers' GPU: NVIDIA H100 80GB HBM3, FlashInfer 0.7.4+kvpeers." in text
    assert "two machines" not in text
    print("batch: every batch peer, the fastest, floors, ratios, summary, flags ok")


def run_main_text_without_verify():
    with tempfile.TemporaryDirectory() as tmp:
        return run_main(tmp, extra=["--no-plot"])


def test_cli_missing_peers_file():
    with tempfile.TemporaryDirectory() as tmp:
        kvp = os.path.join(tmp, "kvlayer.json")
        with open(kvp, "w") as f:
            json.dump(synthetic_kvlayer(), f)
        out = os.path.join(tmp, "o")
        p = subprocess.run([sys.executable, SCRIPT, "--kvlayer", kvp, "--peers",
                            os.path.join(tmp, "missing.json"), "--out", out, "--no-plot"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert "no peers" in p.stderr and os.path.exists(os.path.join(out, "RESULTS.md"))
    print("CLI: a missing peers file still gives RESULTS.md")


if __name__ == "__main__":
    tests = [test_join, test_results_md, test_verify, test_batch, test_no_peers_no_matplotlib,
             test_cli_missing_peers_file]
    for t in tests:
        t()
    print(f"{len(tests)} passed, 0 failed")
