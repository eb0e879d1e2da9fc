#!/usr/bin/env python3
"""verify_peers.py: the peers that can verify T draft tokens in one call, timed on one GPU.

The verify step of speculative decoding: T queries of one request attend every cached key,
with a causal mask over the last T keys. With L cached keys, query i (0 <= i < T) sees keys
[0, L - T + i]; with a window of W keys it sees [L - T + i + 1 - W, L - T + i]. These are the
same views as `kvlayer bench`'s verify rows (verify_dc_graph / verify_dcw_graph, SPEC §11), for
the same geometries, lengths and T, so that tools/bench-peers can put them side by side.

Peers (names are <impl>_<kv dtype>):
  sdpa_cudnn_f16 / sdpa_flash_f16   torch SDPA pinned to one backend (sdpa_kernel), fp16 cache
                                    [1, n_kv, S, D], T queries [1, n_q, T, D], GQA through
                                    enable_gqa when this torch has it (else K/V are expanded)
  sdpa_efficient_f16                the same on the memory-efficient backend (not in 'all')
  fi_prefill_f16 / fi_prefill_e4m3  FlashInfer BatchPrefillWithPagedKVCacheWrapper, backend
                                    fa2, CUDA-graph mode, page size 32, NHD, fp16 queries

Mask forms, tried in this order on a small case per geometry; the first that runs and matches
the fp32 reference serves that geometry's rows (the JSON's `form` says which one ran):
  sdpa flash      causal_lower_right (bottom-right causal; flash takes no explicit mask). A
                  window needs a band mask, so flash sits out the window rows (the reason is
                  in their note).
  sdpa cuDNN      an explicit boolean mask [T, S], then causal_lower_right (which, with the
                  flash and efficient backends off, materializes the same mask on every call)
  sdpa efficient  causal_lower_right, then the explicit mask
  FlashInfer      causal=True (FlashInfer aligns it bottom-right); for a window a packed
                  custom mask: window_left needs the use_swa modules, which
                  ../shared/peers/whl does not prebuild
A windowed peer reads only the keys its view needs: SDPA a cache slice from the window's first
key (rounded down to 8 keys, the slack masked), FlashInfer the pages that hold it.

What ../shared/peers/whl prebuilds for FlashInfer (build_aot.py): the fa2 batch prefill module
(the one BatchPrefillWithPagedKVCacheWrapper(backend="fa2") loads) for fp16 and e4m3 KV at
head dims 128 and 256, without sliding window, all mask modes. single_prefill_with_kv_cache,
the fa3 (sm90) prefill and the use_swa variants are not prebuilt, and this script never JIT-
compiles them (FLASHINFER_DISABLE_JIT, unless --allow-jit): those forms are not available.

Method (peers.py's, whose Timer and Ctx this script imports): each peer is captured in one CUDA
graph of >= 16 calls, each call on another cache copy (cold L2: the copies together exceed
--rotate-mb), replayed 30 times; us per call = median replay / calls. Each timed output (copy
0) is checked against an fp32 attention on the same (dequantized) values with the same mask
(max_abs_err; > 10% of the reference's max abs is flagged, ok false); on the small case per
geometry (L = T + 8 flat, L = T + 24 with a window of 8) a wrong mask is far outside that, which
at 128K keys it would not be: a form that fails there is flagged on every row.

  python3 tools/verify_peers.py --json out.json [--budget-s 90] [--geoms 8x128x8,...]
      [--keys 4096,...] [--window 4096 --window-keys 131072] [--queries 1,2,4,8,16]
      [--peers sdpa_cudnn_f16,...] [--peers-dir .peers] [--allow-jit] [--dry-run]
"""
import argparse
import inspect
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
DEFAULT_GEOMS = "8x128x8,4x256x8"  # n_kv_heads x head_dim x gqa, as kvlayer bench's verify rows
DEFAULT_KEYS = "4096,16384,131072"
DEFAULT_QUERIES = "1,2,4,8,16,32,64"
ALL_PEERS = ["sdpa_cudnn_f16", "sdpa_flash_f16", "sdpa_efficient_f16",
             "fi_prefill_f16", "fi_prefill_e4m3"]
DEFAULT_PEERS = ["sdpa_cudnn_f16", "sdpa_flash_f16", "fi_prefill_f16", "fi_prefill_e4m3"]
SDPA_ALIGN = 8  # keys: an SDPA window slice starts on a multiple of 8 (mask rows stay aligned)
CHECK_WINDOW = 8  # the window of the small mask-check case
FORM_TEXT = {
    "mask": "explicit boolean mask",
    "lower_right": "causal_lower_right (bottom-right causal)",
    "causal": "causal=True (bottom-right)",
    "custom_mask": "packed custom mask (window_left needs a use_swa module, not prebuilt)",
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="write results here (JSON)")
    ap.add_argument("--geoms", default=DEFAULT_GEOMS,
                    help="comma list of KVHEADSxHEADDIMxGQA (default %(default)s)")
    ap.add_argument("--keys", default=DEFAULT_KEYS, help="cache lengths of the flat rows")
    ap.add_argument("--window", type=int, default=4096,
                    help="window of the windowed rows (0: none; default %(default)s)")
    ap.add_argument("--window-keys", default="131072",
                    help="cache lengths of the windowed rows (default %(default)s)")
    ap.add_argument("--queries", default=DEFAULT_QUERIES, help="the T values (default %(default)s)")
    ap.add_argument("--peers", default="all",
                    help=f"comma list of peer names, or 'all' ({','.join(DEFAULT_PEERS)})")
    ap.add_argument("--skip", default="", help="comma list of peer names to leave out")
    ap.add_argument("--peers-dir", default=None,
                    help="folder of peers.py (default: $KVLAYER_PEERS_DIR, .peers, ../shared/peers)")
    ap.add_argument("--page-size", type=int, default=32, help="page size of the FlashInfer peers")
    ap.add_argument("--rotate-mb", type=float, default=256.0,
                    help="cache copies per graph so that the bytes between two uses of one "
                         "copy exceed this (L2 is 50-60 MB)")
    ap.add_argument("--max-copy-gb", type=float, default=8.0,
                    help="cap on the memory of all copies of one cache")
    add_run_args(ap)
    ap.add_argument("--no-check", action="store_true",
                    help="no fp32 reference checks (forms untested: ok is null)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU)")
    a = ap.parse_args(argv)

    def ints(text, what):
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--{what} '{text}' must be a comma list of integers")
        if any(v < 1 for v in vals):
            ap.error(f"--{what} '{text}' must be positive")
        return vals

    a.geom_list = []
    for g in a.geoms.split(","):
        g = g.strip()
        if not g:
            continue
        try:
            h, d, q = (int(x) for x in g.lower().split("x"))
        except ValueError:
            ap.error(f"--geoms: '{g}' is not KVHEADSxHEADDIMxGQA")
        a.geom_list.append((h, d, q))
    a.key_list = ints(a.keys, "keys")
    a.window_key_list = ints(a.window_keys, "window-keys") if a.window > 0 else []
    if a.window < 0:
        ap.error("--window must be >= 0")
    a.window = a.window or None
    a.query_list = ints(a.queries, "queries")
    if not a.query_list:
        ap.error("--queries is empty")
    a.t_max = max(a.query_list)
    a.peer_list = parse_peers(ap, a, DEFAULT_PEERS, ALL_PEERS)
    if a.page_size < 1:
        ap.error("--page-size must be >= 1")
    return a


# ---------------------------------------------------------------------------------------
# views and masks (no torch: tests/test_verify_peers.py checks these on the CPU)


def view_start(keys, t, window, align):
    """First absolute key of the cache slice that a verify of t queries over `keys` keys
    reads: 0 without a window, else the window's first key of query 0 rounded down to
    `align` (the keys before it in the slice are masked off)."""
    if not window:
        return 0
    first = max(0, keys - (window + t - 1))
    return first - first % align


def query_bounds(keys, t, window, start=0):
    """[(lo, hi)] inclusive key range of each query i < t, as indices into a slice that
    begins at absolute key `start`: hi = keys - t + i, lo = hi + 1 - window (or 0)."""
    out = []
    for i in range(t):
        hi = keys - t + i
        lo = max(0, hi + 1 - window) if window else 0
        out.append((lo - start, hi - start))
    return out


def mask_rows(bounds, n):
    """The mask as lists of bools: row i, column j is True when query i sees slice key j."""
    return [[lo <= j <= hi for j in range(n)] for lo, hi in bounds]


def band_mask(xp, bounds, n, device=None):
    """The mask as a [t, n] boolean array of module xp (numpy or torch)."""
    kw = {} if device is None else {"device": device}
    lo = xp.asarray([b[0] for b in bounds], **kw)[:, None]
    hi = xp.asarray([b[1] for b in bounds], **kw)[:, None]
    cols = xp.arange(n, **kw)[None, :]
    return (cols >= lo) & (cols <= hi)


def pack_mask_little(bounds, n):
    """The mask flattened row-major ([t, n]) and bit-packed little-endian into bytes: FlashInfer's
    packed custom mask (bit (i * n + j) % 8 of byte (i * n + j) // 8)."""
    out = bytearray((len(bounds) * n + 7) // 8)
    for i, (lo, hi) in enumerate(bounds):
        for j in range(max(lo, 0), min(hi, n - 1) + 1):
            off = i * n + j
            out[off >> 3] |= 1 << (off & 7)
    return bytes(out)


def is_lower_right(bounds, n):
    """True when the bounds are the bottom-right causal mask of a [t, n] block."""
    t = len(bounds)
    return all(lo == 0 and hi == n - t + i for i, (lo, hi) in enumerate(bounds))


def peer_group(peer):
    """(layout, kv dtype) of the cache a peer reads: peers of one group share its copies."""
    return ("HND", "f16") if peer.startswith("sdpa_") else ("NHD", peer_kv(peer))


def forms_for(peer, windowed):
    """The mask forms to try for a peer, in order ([] = the peer cannot serve the view)."""
    impl = peer_impl(peer)
    if impl == "sdpa_flash":
        return [] if windowed else ["lower_right"]
    if impl == "sdpa_cudnn":
        return ["mask"] if windowed else ["mask", "lower_right"]
    if impl == "sdpa_efficient":
        return ["mask"] if windowed else ["lower_right", "mask"]
    if impl == "fi_prefill":
        return ["custom_mask"] if windowed else ["causal"]
    raise ValueError(peer)


def cannot_serve(peer):
    if peer_impl(peer) == "sdpa_flash":
        return ("skipped: the flash backend takes no explicit mask (only causal_lower_right), "
                "and a window needs a band mask")
    return "skipped: no mask form for this view"


def check_case(t_max, windowed):
    """(keys, window) of the small mask-check case: few keys per query, so that one key too
    many or too few moves the output far past the 10% flag."""
    return (t_max + 24, CHECK_WINDOW) if windowed else (t_max + 8, None)


def points(a):
    """(geometry, keys, window) of every timed row group, in kvlayer bench's order."""
    out = []
    for g in a.geom_list:
        out += [(g, k, None) for k in a.key_list]
        out += [(g, k, a.window) for k in a.window_key_list]
    return out


def base_row(peer, g, keys, window, t):
    h, d, q = g
    return {"peer": peer, "shape": f"{h}x{d} gqa {q}", "n_kv_heads": h, "head_dim": d, "gqa": q,
            "keys": keys, "window": window, "queries": t, "us": None, "max_abs_err": None,
            "ok": None, "note": ""}


# ---------------------------------------------------------------------------------------
# the run (any runner: TorchRunner on the GPU, a fake one in the CPU test)


def run_all(a, runner, rows, dump, t0):
    over = lambda: time.time() - t0 > a.budget_s  # noqa: E731
    groups = []
    for p in a.peer_list:
        if peer_group(p) not in [g for g, _ in groups]:
            groups.append((peer_group(p), []))
        next(ps for g, ps in groups if g == peer_group(p)).append(p)
    variants = [False] + ([True] if a.window and a.window_key_list else [])

    for g in a.geom_list:
        forms = {}  # (peer, windowed) -> (form or None, check passed: True/False/None, note)
        for windowed in variants:
            keys, window = check_case(a.t_max, windowed)
            for peer in a.peer_list:
                cand = forms_for(peer, windowed)
                if not cand:
                    forms[(peer, windowed)] = (None, None, cannot_serve(peer))
                    continue
                if a.no_check:
                    forms[(peer, windowed)] = (cand[0], None, "")
                    continue
                row = base_row(peer, g, keys, window, a.t_max)
                row["check"] = True
                if over():
                    row["error"] = "skipped: time budget"
                    rows.append(row)
                    forms[(peer, windowed)] = (cand[0], None, "mask check skipped: time budget")
                    continue
                tried, chosen, first_ran = [], None, None
                for form in cand:
                    r = {}
                    label = f"check {row['shape']} keys {keys} window {window} {peer} {form}"
                    if guarded(runner, rows, label, r, lambda: runner.check_form(
                            peer, g, keys, window, a.t_max, form), row) is not None:
                        tried.append(f"{form}: {r['error']}")
                        continue
                    good = within(r["max_abs_err"], r["ref_max_abs"])
                    tried.append(f"{form}: max abs err {r['max_abs_err']:.1e}" +
                                 ("" if good else " (off by > 10%)"))
                    if good:
                        chosen = (form, r)
                        break
                    if first_ran is None:
                        first_ran = (form, r)
                if chosen:
                    forms[(peer, windowed)] = (chosen[0], True, "")
                elif first_ran:
                    forms[(peer, windowed)] = (first_ran[0], False,
                                               "failed the small mask check: " + "; ".join(tried))
                else:
                    forms[(peer, windowed)] = (None, False,
                                               "no mask form ran on the small case: " +
                                               "; ".join(tried))
                pick = chosen or first_ran
                if pick:
                    row.update(form=pick[0], max_abs_err=pick[1]["max_abs_err"],
                               ref_max_abs=pick[1]["ref_max_abs"])
                row["ok"] = chosen is not None
                row["note"] = "mask check (small case): " + "; ".join(tried)
                rows.append(row)
                print(f"  check {row['shape']:>12} keys {keys:>3} window {window or '-':>2} "
                      f"T{a.t_max} {peer:<18} -> {pick[0] if pick else 'none'}  "
                      f"({'; '.join(tried)})", flush=True)
                dump()

        for gg, keys, window in points(a):
            if gg != g:
                continue
            windowed = window is not None
            for group, gpeers in groups:
                usable = [p for p in gpeers if forms[(p, windowed)][0] is not None]
                for p in gpeers:
                    if p not in usable:
                        for t in a.query_list:
                            row = base_row(p, g, keys, window, t)
                            row["error"] = forms[(p, windowed)][2]
                            if forms[(p, windowed)][1] is False:
                                row["ok"] = False
                            rows.append(row)
                if not usable:
                    continue
                if over():
                    for p in usable:
                        for t in a.query_list:
                            row = base_row(p, g, keys, window, t)
                            row["error"] = "skipped: time budget"
                            rows.append(row)
                    continue
                ctx = None
                setup = {}
                label = f"setup {g} keys {keys} window {window} {group}"
                if guarded(runner, rows, label, setup,
                           lambda: {"ctx": runner.open(g, keys, window, group)}) is None:
                    ctx = setup.pop("ctx")
                try:
                    for p in usable:
                        form, check_ok, check_note = forms[(p, windowed)]
                        for t in a.query_list:
                            row = base_row(p, g, keys, window, t)
                            row["form"] = form
                            if ctx is None:
                                row["error"] = f"setup: {setup.get('error')}"
                                rows.append(row)
                                continue
                            if over():
                                row["error"] = "skipped: time budget"
                                rows.append(row)
                                continue
                            t1 = time.time()
                            label = f"{row['shape']} keys {keys} window {window} T{t} {p}"
                            ran = guarded(runner, rows, label, row,
                                          lambda: runner.measure(ctx, p, t, form), row) is None
                            row["wall_s"] = round(time.time() - t1, 2)
                            notes = [FORM_TEXT.get(form, form)] + ([row["note"]] if row["note"]
                                                                   else [])
                            if ran and row.get("max_abs_err") is not None:
                                full = within(row["max_abs_err"], row["ref_max_abs"])
                                if not full:
                                    notes.append("output off the fp32 reference by > 10%")
                                if check_ok is False:
                                    notes.append(check_note)
                                row["ok"] = bool(full and check_ok is not False)
                            elif ran and check_ok is False:
                                row["ok"] = False
                                notes.append(check_note)
                            elif not ran:
                                row["ok"] = False
                            row["note"] = "; ".join(notes)
                            rows.append(row)
                            if ran:
                                err = row.get("max_abs_err")
                                print(f"  {row['shape']:>12} {keys:>7} w{window or '-':<5} "
                                      f"T{t:<3} {p:<18} {row['us']:9.2f} us  err "
                                      f"{'-' if err is None else f'{err:.1e}'}  ok {row['ok']}  "
                                      f"({row.get('method')}, {row.get('calls_per_graph')} calls, "
                                      f"{row.get('copies')} copies, {row['wall_s']:.1f} s)",
                                      flush=True)
                            dump()
                finally:
                    if ctx is not None:
                        runner.close(ctx)


# ---------------------------------------------------------------------------------------
# the GPU side (torch, peers.py, FlashInfer): imported only when measuring


def sdpa_takes_enable_gqa(torch):
    f = torch.nn.functional.scaled_dot_product_attention
    try:
        return "enable_gqa" in inspect.signature(f).parameters
    except (TypeError, ValueError):  # a builtin without a signature: its docstring has one
        return "enable_gqa" in (f.__doc__ or "").split("\n\n")[0]


def reference_verify(torch, q, kf, vf, gqa, sm_scale, mask):
    """fp32 attention of t queries. q [t, n_q, D], kf/vf [S, n_kv, D] fp32, mask [t, S] bool
    (True: the query sees the key) -> [t, n_q, D] fp32; query head h reads KV head h // gqa."""
    t, hq, d = q.shape
    hkv = kf.shape[1]
    qf = q.float().reshape(t, hkv, gqa, d)
    sc = torch.einsum("thgd,shd->hgts", qf, kf) * sm_scale
    sc = sc.masked_fill(~mask, float("-inf"))
    p = torch.softmax(sc, dim=-1)
    return torch.einsum("hgts,shd->thgd", p, vf).reshape(t, hq, d)


class OneCopy:
    """A Timer stand-in for peers.Ctx on the check cases: one copy, nothing is timed."""

    @staticmethod
    def copies_for(nbytes):
        return 1


class TorchRunner:
    # SDPBackend member per peer (the CPU test swaps in MATH)
    sdpa_backends = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
                     "sdpa_efficient": "EFFICIENT_ATTENTION"}

    def __init__(self, torch, pm, a):
        self.torch, self.pm, self.a = torch, pm, a
        self.timer = pm.Timer(torch, a)
        self.gqa_kw = sdpa_takes_enable_gqa(torch)
        self._fip = None

    def env(self):
        info = self.pm.env_info(self.torch)
        info["sdpa_enable_gqa"] = self.gqa_kw
        try:
            self.fi_prefill()
            info["flashinfer_prefill"] = "imported"
        except Exception as e:
            info["flashinfer_prefill"] = short(e)
        return info

    def fi_prefill(self):
        if self._fip is None:
            import flashinfer.prefill as fip  # the trimmed wheel: import submodules explicitly
            self._fip = fip
        return self._fip

    def synchronize(self):
        self.torch.cuda.synchronize()

    def dtype(self, kv):
        return {"f16": self.torch.float16, "e4m3": self.torch.float8_e4m3fn}[kv]

    def _ctx(self, g, keys, window, timer):
        hkv, d, gqa = g
        a = self.a
        align = SDPA_ALIGN * a.page_size // math.gcd(SDPA_ALIGN, a.page_size)
        base = view_start(keys, a.t_max, window, align)
        alloc = -(-(keys - base) // align) * align  # FlashInfer needs whole pages
        ctx = self.pm.Ctx(self.torch, a, timer, hkv, d, gqa, alloc)
        ctx.L, ctx.window, ctx.base = keys, window, base
        ctx.q_all = self.torch.randn(a.t_max, hkv * gqa, d, device=self.pm.DEVICE,
                                     dtype=self.torch.float32, generator=ctx.gen).half()
        return ctx

    def open(self, g, keys, window, group):
        ctx = self._ctx(g, keys, window, self.timer)
        layout, kv = group
        ctx.kv(layout, self.dtype(kv))  # the group's copies, made once for all its peers and T
        ctx.group = group
        return ctx

    def close(self, ctx):
        ctx.keep.clear()
        ctx._kv.clear()
        ctx._deq = None
        self.torch.cuda.empty_cache()

    def _reference(self, ctx, t, lo, hi, start):
        k0f, v0f = ctx._deq
        mask = band_mask(self.torch, query_bounds(ctx.L, t, ctx.window, start), hi - lo,
                         device=k0f.device)
        return reference_verify(self.torch, ctx.q_all[:t], k0f[lo:hi], v0f[lo:hi], ctx.gqa,
                                ctx.sm_scale, mask)

    def _build(self, ctx, peer, t, form):
        """(calls, out0, lo, hi, start, fields): calls time the peer, out0() is its [t, n_q, D]
        output on copy 0, [lo, hi) the slice of the cache it reads, starting at absolute key
        `start`."""
        align = SDPA_ALIGN if peer.startswith("sdpa_") else self.a.page_size
        start = view_start(ctx.L, t, ctx.window, align)
        lo, hi = start - ctx.base, ctx.L - ctx.base
        bounds = query_bounds(ctx.L, t, ctx.window, start)
        kv = peer_kv(peer)
        fields = {"kv_keys": hi - lo,
                  "bytes": (hi - lo) * ctx.hkv * ctx.d * 2 * (2 if kv == "f16" else 1)}
        if peer.startswith("sdpa_"):
            calls, out0, note = self._sdpa(ctx, peer, t, form, lo, hi, bounds)
        else:
            calls, out0, note = self._fi(ctx, peer, t, form, lo, hi, bounds)
        if note:
            fields["note"] = note
        return calls, out0, lo, hi, start, fields

    def _sdpa(self, ctx, peer, t, form, lo, hi, bounds):
        torch = self.torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = getattr(SDPBackend, self.sdpa_backends[peer_impl(peer)])
        kvs = [(k[:, :, lo:hi], v[:, :, lo:hi]) for k, v in ctx.kv("HND", torch.float16)]
        note = ""
        if not self.gqa_kw:
            kvs = [(k.repeat_interleave(ctx.gqa, 1), v.repeat_interleave(ctx.gqa, 1))
                   for k, v in kvs]
            note = "no enable_gqa in this torch: K/V expanded to the query heads (gqa x bytes)"
        n = hi - lo
        if form == "mask":
            attn = band_mask(torch, bounds, n, device=ctx.q_all.device)
        elif form == "lower_right":
            if not is_lower_right(bounds, n):
                raise ValueError("causal_lower_right cannot express this view")
            from torch.nn.attention.bias import causal_lower_right
            attn = causal_lower_right(t, n)
        else:
            raise ValueError(f"form {form} is not an SDPA form")
        q4 = ctx.q_all[:t].permute(1, 0, 2).unsqueeze(0).contiguous()  # [1, n_q, t, D]
        kw = {"attn_mask": attn, "scale": ctx.sm_scale}
        if self.gqa_kw:
            kw["enable_gqa"] = True
        ctx.keep.append((kvs, attn, q4))

        def mk(k, v):
            def f():
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q4, k, v, **kw)
            return f
        calls = [mk(k, v) for k, v in kvs]
        return calls, lambda: calls[0]()[0].permute(1, 0, 2), note

    def _fi(self, ctx, peer, t, form, lo, hi, bounds):
        torch = self.torch
        fip = self.fi_prefill()
        dt = self.dtype(peer_kv(peer))
        ps = self.a.page_size
        dev = ctx.q_all.device
        if lo % ps:
            raise ValueError(f"slice start {lo} is not on a page")
        n = hi - lo
        npg = -(-n // ps)
        pkv = [(k.view(-1, ps, ctx.hkv, ctx.d), v.view(-1, ps, ctx.hkv, ctx.d))
               for k, v in ctx.kv("NHD", dt)]
        if not hasattr(ctx, "fi_ws"):
            ctx.fi_ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
        qo = torch.tensor([0, t], dtype=torch.int32, device=dev)
        indptr = torch.tensor([0, npg], dtype=torch.int32, device=dev)
        indices = torch.arange(lo // ps, lo // ps + npg, dtype=torch.int32, device=dev)
        last = torch.tensor([n - ps * (npg - 1)], dtype=torch.int32, device=dev)
        packed = mask_indptr = None
        if form == "custom_mask":
            packed = torch.tensor(list(pack_mask_little(bounds, n)), dtype=torch.uint8,
                                  device=dev)
            mask_indptr = torch.zeros(2, dtype=torch.int32, device=dev)
        elif form != "causal" or not is_lower_right(bounds, n):
            raise ValueError(f"form {form} cannot express this view")
        w = fip.BatchPrefillWithPagedKVCacheWrapper(
            ctx.fi_ws, "NHD", use_cuda_graph=True, qo_indptr_buf=qo,
            paged_kv_indptr_buf=indptr, paged_kv_indices_buf=indices,
            paged_kv_last_page_len_buf=last, custom_mask_buf=packed,
            mask_indptr_buf=mask_indptr, backend="fa2")
        w.plan(qo, indptr, indices, last, ctx.hq, ctx.hkv, ctx.d, ps,
               packed_custom_mask=packed, causal=form == "causal", pos_encoding_mode="NONE",
               sm_scale=ctx.sm_scale, q_data_type=torch.float16, kv_data_type=dt)
        q = ctx.q_all[:t].contiguous()  # [t, n_q, D]
        out = torch.empty_like(q)
        ctx.keep.append((w, qo, indptr, indices, last, packed, mask_indptr, q, out, pkv))

        def mk(k, v):
            def f():
                return w.run(q, (k, v), out=out)
            return f
        calls = [mk(k, v) for k, v in pkv]

        def out0():
            calls[0]()
            return out.clone()
        return calls, out0, ""

    def _error(self, ctx, out0, t, lo, hi, start):
        o = out0().float()
        ref = self._reference(ctx, t, lo, hi, start)
        return {"max_abs_err": float((o - ref).abs().max()),
                "ref_max_abs": float(ref.abs().max())}

    def check_form(self, peer, g, keys, window, t, form):
        ctx = self._ctx(g, keys, window, OneCopy())
        try:
            calls, out0, lo, hi, start, _ = self._build(ctx, peer, t, form)
            return self._error(ctx, out0, t, lo, hi, start)
        finally:
            self.close(ctx)

    def measure(self, ctx, peer, t, form):
        try:
            calls, out0, lo, hi, start, fields = self._build(ctx, peer, t, form)
            if not self.a.no_check:
                fields.update(self._error(ctx, out0, t, lo, hi, start))
            us, method, ncalls, us_min = self.timer.run(calls)
            fields.update(us=us, us_min=us_min, method=method, calls_per_graph=ncalls,
                          copies=len(calls))
            return fields
        finally:
            ctx.keep.clear()


# ---------------------------------------------------------------------------------------


def fmt_table(rows):
    lines = [f"{'shape':>12} {'keys':>7} {'window':>6} {'T':>3} {'peer':<18} {'us':>9} "
             f"{'err':>8} {'ok':>5}  note"]
    for r in rows:
        us = f"{r['us']:.2f}" if r.get("us") is not None else "-"
        err = f"{r['max_abs_err']:.1e}" if r.get("max_abs_err") is not None else "-"
        note = r.get("error") or r.get("note") or ""
        lines.append(f"{r['shape']:>12} {r['keys']:>7} {r['window'] or '-':>6} "
                     f"{r['queries']:>3} {r['peer']:<18} {us:>9} {err:>8} {str(r['ok']):>5}  "
                     f"{note[:100]}")
    return "\n".join(lines)


def main(argv=None, runner_factory=None):
    """runner_factory(a) -> a runner (tests pass a fake one; default: TorchRunner on CUDA)."""
    a = parse_args(argv)
    pts = points(a)
    n_rows = len(pts) * len(a.peer_list) * len(a.query_list)
    print(f"verify_peers.py: {len(a.geom_list)} geometries, {len(pts)} (keys, window) points x "
          f"{len(a.peer_list)} peers x T in {a.query_list} = {n_rows} rows (+ mask checks), "
          f"budget {a.budget_s:.0f} s", flush=True)
    if a.dry_run:
        for g, k, w in pts:
            print(f"   {g[0]}x{g[1]} gqa {g[2]}  keys {k}  window {w or '-'}  peers "
                  f"{','.join(a.peer_list)}")
        return 0
    if not a.allow_jit:
        os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    t0 = time.time()
    if runner_factory is None:
        pm = import_peers(a.peers_dir)
        torch = cuda_torch("verify_peers.py")
        if torch is None:
            return 3
        runner = TorchRunner(torch, pm, a)
    else:
        runner = runner_factory(a)
    info = runner.env()
    print("env:", json.dumps(info), flush=True)
    result = {"env": info,
              "args": json_args(a),
              "method": "each peer captured in one CUDA graph of >= min_calls calls over "
                        "rotating cache copies (cold L2), median replay / calls (peers.py's "
                        "Timer); fp32 reference with the same mask on copy 0",
              "rows": []}

    def dump():
        write_json(a.json, result)

    rc = run_saved("verify_peers.py", lambda: run_all(a, runner, result["rows"], dump, t0),
                   result, dump, t0)
    print()
    print(fmt_table(result["rows"]))
    print(f"\ntotal {result['total_s']} s; json: {a.json}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
