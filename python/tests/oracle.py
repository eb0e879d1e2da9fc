"""The float64 attention the GPU tests compare kvlayer.KvLayer with: NumPy over the reference
layer's dequantized cache, independent of the C++ reference's decode (test_reference.py checks
that the two agree to rounding)."""

import numpy as np

import kvlayer


def attention64(layer, q, view, scale=None):
    """Float64 attention in NumPy over the dequantized cache (the GPU tests' oracle): q
    (n_q_heads, head_dim_k) over logical rows [begin, end) at physical row - base."""
    g = layer.geometry
    begin, end, base = view
    nq = q.shape[0]
    gqa = nq // g.n_kv_heads
    keys = kvlayer.dequantize_q8_0(layer.k_plane[begin - base:end - base]).astype(np.float64)
    vals = kvlayer.dequantize_q5_1(layer.v_plane[begin - base:end - base]).astype(np.float64)
    keys = keys.reshape(end - begin, g.n_kv_heads, g.head_dim_k)
    vals = vals.reshape(end - begin, g.n_kv_heads, g.head_dim_v)
    s = np.float64(kvlayer.default_scale(g.head_dim_k) if scale is None else np.float32(scale))
    out = np.zeros((nq, g.head_dim_v))
    for h in range(nq):
        if end == begin:
            continue
        scores = keys[:, h // gqa, :] @ q[h].astype(np.float64) * s
        p = np.exp(scores - scores.max())
        out[h] = p @ vals[:, h // gqa, :] / p.sum()
    return out
