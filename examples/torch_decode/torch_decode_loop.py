#!/usr/bin/env python3
"""A PyTorch decode loop on kvlayer, beside torch's scaled_dot_product_attention on an fp16 cache.

One attention layer (8 KV heads of 128, 32 query heads by default):
  1. prefill: PREFILL random post-RoPE K/V rows appended to kvlayer (quantized to q8_0 / q5_1
     on the GPU) and written to an fp16 cache [1, kv_heads, max_ctx, head_dim] for SDPA;
  2. decode: one step (append_dc -> inc_seqlen -> decode_dc) run once eagerly, captured with
     torch.cuda.graph, then replayed STEPS times with new rows and queries copied into its
     static inputs (account_steps after each replay); SDPA decodes the fp16 cache eagerly;
  3. a speculative step: DRAFT draft rows appended, all DRAFT queries verified in one
     decode_rows, the accepted prefix kept with rewind; then the same step on device counters
     (append_rows_dc -> inc_seqlen(T) -> decode_rows_dc) captured and replayed;
  4. timing: the decode and the verify as replayed graphs, kvlayer's and SDPA's (graph-captured
     too, at the same length), with CUDA events.

Errors are against a float64 attention over the original (fp16) rows: kvlayer's include the
8-bit / 5-bit quantization of the cache, SDPA's only fp16 arithmetic. kvlayer is also checked
against its own contract: the float64 attention over its dequantized cache, within the bound
kvlayer.reference.decode_bound derives for the layer's launch (SPEC §8).

Needs a CUDA GPU (sm_90), PyTorch >= 2.5 (SDPA's enable_gqa) and kvlayer (README: Python):
    python3 examples/torch_decode/torch_decode_loop.py [--steps 64] [--prefill 4000] [--draft 4]
Exit status: 0 passed, 1 a check failed, 77 no CUDA device (nothing to run).
"""

import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F

import kvlayer
import kvlayer.reference as kref


def attention64(q, k, v, lengths):
    """Float64 attention of queries q [T, HQ, D] over k, v [L, H, D] (GQA), query i attending
    keys [0, lengths[i]); scale 1/sqrt(D)."""
    hq, h, d = q.shape[1], k.shape[1], q.shape[2]
    kk = k.double().repeat_interleave(hq // h, dim=1)  # [L, HQ, D]
    vv = v.double().repeat_interleave(hq // h, dim=1)
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for i, n in enumerate(lengths):
        s = torch.einsum("hd,lhd->hl", q[i].double(), kk[:n]) / d ** 0.5
        out[i] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), vv[:n])
    return out


def time_graph(graph, reps=200):
    """Microseconds per replay of a captured graph (CUDA events, after a warm-up)."""
    for _ in range(10):
        graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1000.0 / reps


def capture(fn):
    """fn captured into a CUDA graph after warm-up runs on a side stream (torch's advice: the
    libraries behind SDPA initialize lazily); returns (graph, fn's output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128, choices=kvlayer.cuda_head_dims)
    ap.add_argument("--prefill", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--draft", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not torch.cuda.is_available() or not kvlayer.cuda_available():
        print("torch_decode_loop: no CUDA device:",
              kvlayer.cuda_unavailable_reason() or "torch sees none")
        return 77
    dev = torch.device("cuda")
    torch.manual_seed(a.seed)
    H, HQ, D, T = a.kv_heads, a.q_heads, a.head_dim, a.draft
    max_ctx = a.prefill + a.steps + 4 * T + 16
    layer = kvlayer.KvLayer(H, D, max_ctx, HQ, max_verify=max(16, T), device=dev)
    k16 = torch.zeros(max_ctx, H, D, dtype=torch.float16, device=dev)  # the fp16 cache
    v16 = torch.zeros_like(k16)
    failures = []

    def rows(n):
        return (torch.randn(n, H, D, device=dev).half(), torch.randn(n, H, D, device=dev).half())

    def sdpa(q, n, mask=None):
        """SDPA over the fp16 cache's first n rows: q [T, HQ, D] float32 -> [T, HQ, D]."""
        kk = k16[:n].permute(1, 0, 2).unsqueeze(0)  # [1, H, n, D]
        vv = v16[:n].permute(1, 0, 2).unsqueeze(0)
        o = F.scaled_dot_product_attention(q.half().permute(1, 0, 2).unsqueeze(0), kk, vv,
                                           attn_mask=mask, enable_gqa=True)
        return o[0].permute(1, 0, 2).float()

    def contract(q, got, what):
        """kvlayer's output against the float64 attention over its dequantized cache, within
        decode_bound (a reference layer restored from the GPU layer's snapshot)."""
        ref = kref.KvLayer.from_geometry(layer.geometry, HQ)
        ref.restore(layer.snapshot())
        hq = q.cpu().numpy()
        if hq.ndim == 2:
            bound = kref.decode_bound(ref, hq, layer.accumulation_shape())
            want = ref.decode(hq)
        else:
            bound = kref.decode_rows_bound(ref, hq, layer.verify_accumulation_shape(hq.shape[0]))
            want = ref.decode_rows(hq)
        err = np.abs(got.cpu().double().numpy() - want)
        used = float((err / np.maximum(bound.bound, 1e-300)).max())  # the share of it used
        if not (err <= bound.bound).all():
            failures.append(f"{what}: outside the bound ({used:.3g} of it)")
        return used

    # ---- 1. prefill --------------------------------------------------------------------------
    k, v = rows(a.prefill)
    layer.append(k, v)
    k16[:a.prefill], v16[:a.prefill] = k, v
    n = a.prefill

    # ---- 2. decode: one step captured, replayed per token ------------------------------------
    k_in = torch.empty(1, H, D, dtype=torch.float16, device=dev)
    v_in = torch.empty_like(k_in)
    q_in = torch.empty(HQ, D, device=dev)
    out = torch.empty(HQ, D, device=dev)

    def step():
        layer.append_dc(k_in, v_in)
        layer.inc_seqlen(1)
        layer.decode_dc(q_in, out)

    graph = None
    print(f"kvlayer {kvlayer.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}: {H} KV heads x {D}, {HQ} query heads, "
          f"prefill {a.prefill}")
    print(f"{'step':>5} {'len':>6} {'kvlayer err':>12} {'SDPA err':>10} {'bound used':>10}")
    for s in range(a.steps):
        k, v = rows(1)
        q = torch.randn(HQ, D, device=dev)
        k_in.copy_(k)
        v_in.copy_(v)
        q_in.copy_(q)
        if graph is None:  # the first step eagerly (kernels load), then the capture
            step()
            graph = torch.cuda.CUDAGraph()
            layer.account_steps(1)
            with torch.cuda.graph(graph):
                step()
        else:
            graph.replay()
            layer.account_steps(1)
        k16[n], v16[n] = k[0], v[0]
        n += 1
        want = attention64(q[None], k16[:n], v16[:n], [n])[0]
        err_kv = (out.double() - want).abs().max().item()
        err_sdpa = (sdpa(q[None], n)[0].double() - want).abs().max().item()
        if s % 16 == 0 or s == a.steps - 1:
            used = contract(q, out, f"decode step {s}")
            print(f"{s:>5} {n:>6} {err_kv:>12.3e} {err_sdpa:>10.3e} {used:>10.3f}")
    assert layer.len == n and layer.status(), layer.status()

    # ---- 3. a speculative step: draft T, verify in one pass, keep the accepted prefix --------
    accepted = T // 2
    k, v = rows(T)
    q = torch.randn(T, HQ, D, device=dev)
    layer.append(k, v)
    got = layer.decode_rows(q)
    k16[n:n + T], v16[n:n + T] = k, v
    lengths = [n + i + 1 for i in range(T)]
    want = attention64(q, k16[:n + T], v16[:n + T], lengths)
    causal = torch.arange(n + T, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None]
    used = contract(q, got, "verify")
    print(f"verify T {T} at len {n + T}: kvlayer err {(got.double() - want).abs().max().item():.3e}"
          f", SDPA err {(sdpa(q, n + T, causal).double() - want).abs().max().item():.3e}, "
          f"bound used {used:.3f}; accepting {accepted}")
    layer.rewind(layer.len - T + accepted)
    n += accepted

    # The same step on device counters (drafts, inc_seqlen(T), verify), run eagerly once and
    # then captured and replayed; after each, account_steps(T) and the accepting rewind.
    dk = torch.empty(T, H, D, dtype=torch.float16, device=dev)
    dv = torch.empty_like(dk)
    dq = torch.empty(T, HQ, D, device=dev)
    dout = torch.empty(T, HQ, D, device=dev)

    def spec_step():
        layer.append_rows_dc(dk, dv)
        layer.inc_seqlen(T)
        layer.decode_rows_dc(dq, dout)

    spec = None
    for r in range(3):
        k, v = rows(T)
        q = torch.randn(T, HQ, D, device=dev)
        dk.copy_(k)
        dv.copy_(v)
        dq.copy_(q)
        if spec is None:  # eagerly first (its kernels load outside the capture), then captured
            spec_step()
            spec = torch.cuda.CUDAGraph()
            with torch.cuda.graph(spec):
                spec_step()
        else:
            spec.replay()
        layer.account_steps(T)
        k16[n:n + T], v16[n:n + T] = k, v
        lengths = [n + i + 1 for i in range(T)]
        want = attention64(q, k16[:n + T], v16[:n + T], lengths)
        err = (dout.double() - want).abs().max().item()
        used = contract(q, dout, f"captured verify {r}")
        print(f"{'eager' if r == 0 else 'replayed'} verify {r}: len {n + T}, kvlayer err {err:.3e}, bound used {used:.3f}; "
              f"accepting {r}")
        layer.rewind(layer.len - T + r)
        n += r
    assert layer.len == n and layer.len_d == n and layer.status(), layer.status()

    # ---- 4. timing: replayed graphs at len n, decode-only (idempotent) ---------------------
    q_in.copy_(torch.randn(HQ, D, device=dev))
    g_kv, _ = capture(lambda: layer.decode_dc(q_in, out))
    g_sdpa, _ = capture(lambda: sdpa(q_in[None], n))
    dq.copy_(torch.randn(T, HQ, D, device=dev))
    causal = torch.arange(n, device=dev)[None, :] < torch.arange(n - T + 1, n + 1,
                                                                 device=dev)[:, None]
    g_kv_rows, _ = capture(lambda: layer.decode_rows_dc(dq, dout))
    g_sdpa_rows, _ = capture(lambda: sdpa(dq, n, causal))
    cache_mb = 2 * n * H * D * 2 / 1e6
    print(f"decode at len {n} (graph replay): kvlayer {time_graph(g_kv):.1f} us "
          f"(q8_0/q5_1 cache, {cache_mb * (34 + 24) / 128:.1f} MB), "
          f"SDPA {time_graph(g_sdpa):.1f} us (fp16 cache, {cache_mb:.1f} MB)")
    print(f"verify T {T} at len {n} (graph replay): kvlayer {time_graph(g_kv_rows):.1f} us, "
          f"SDPA with a causal mask {time_graph(g_sdpa_rows):.1f} us")
    assert layer.status(), layer.status()
    for f in failures:
        print("FAILED:", f)
    print("torch_decode_loop:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
