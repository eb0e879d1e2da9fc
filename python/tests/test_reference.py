"""kvlayer.reference.KvLayer against the committed golden data (the C++ reference's tests replay
the same cases): every golden decode and verify case replayed through the Python binding with
planes byte for byte, len/base after every operation, refusals where golden refuses, data errors
and decode outputs within golden's derived tolerance; then the refusals the README documents,
verbatim, each leaving the layer exactly as it was; snapshots; and the float64 attention the GPU
tests use as their oracle, against the reference's decode."""

import numpy as np
import pytest

import kvlayer
import kvlayer.reference as kref
from conftest import refusal
from golden_cases import (decode_cases, layer_of, npy, raw, scale_of, verify_cases, within)
from oracle import attention64


def state(layer):
    """Everything a refusal must leave as it was."""
    return (layer.len, layer.base, layer.len_d, layer.base_d, layer.k_plane.copy(),
            layer.v_plane.copy(), layer.status())


def same_state(a, b):
    return a[:4] == b[:4] and np.array_equal(a[4], b[4]) and np.array_equal(a[5], b[5]) and \
        a[6] == b[6]


# ---- golden replays ------------------------------------------------------------------------------

@pytest.mark.parametrize("case", decode_cases(), ids=lambda c: c["name"])
def test_golden_decode_case(case):
    layer = layer_of(case)
    g = case["geometry"]
    k, v, q = npy(case["k_input"]), npy(case["v_input"]), npy(case["query"])
    outs, mags, smax = npy(case["outputs"]), npy(case["magnitudes"]), npy(case["score_magnitudes"])
    q = q.reshape(case["n_q_heads"], g["head_dim"])
    as_input = np.float16 if case["input_dtype"] == "f16" else np.float32
    scale = scale_of(case)
    for i, op in enumerate(case["ops"]):
        before = state(layer)
        if op["op"] == "append":
            rows = slice(op["src_row"], op["src_row"] + op["n"])
            call = lambda: layer.append(k[rows].astype(as_input), v[rows].astype(as_input))  # noqa
        else:
            call = lambda: layer.rewind(op["to"])  # noqa
        if op["expect"] == "refused":
            refusal(call)
            assert same_state(state(layer), before), f"op {i} refused but changed the state"
        else:
            call()
        assert (layer.len, layer.base) == (op["len"], op["base"]), f"op {i}"
        if op["decode"] == "refused":
            before = state(layer)
            assert refusal(layer.decode, q, scale).startswith("decode: the view starts at")
            assert same_state(state(layer), before)
            continue
        begin, end = layer.view()
        got = layer.decode(q, scale)
        failures = within(got, outs[i], mags[i], smax[i], g["head_dim"], end - begin)
        assert not failures, f"op {i}: " + "; ".join(failures[:5])
    assert np.array_equal(layer.k_plane.reshape(-1), raw(case["final"]["k_plane"]))
    assert np.array_equal(layer.v_plane.reshape(-1), raw(case["final"]["v_plane"]))
    want_error = case.get("data_error")
    got_error = layer.status().data_error
    if want_error is None:
        assert got_error is None, repr(got_error)
    else:
        bits = np.array([got_error.value], dtype=np.float32).view(np.uint32)[0]
        assert (got_error.row, got_error.plane, got_error.block, int(bits)) == (
            want_error["row"], want_error["plane"], want_error["block"],
            int(want_error["value_bits"], 16))


@pytest.mark.parametrize("case", verify_cases(), ids=lambda c: c["name"])
def test_golden_verify_case(case):
    """SPEC §11 through the device-counter variants: reserve(T), append_rows_dc(w) of T drafts,
    inc_seqlen(T), decode_rows_dc(w) (equal to the host-len decode_rows), account_steps(T) and
    the accepting rewind; and host-len decode_rows, refused where golden refuses."""
    layer = layer_of(case)
    g = case["geometry"]
    windowed = g["window"] is not None
    k, v, qs = npy(case["k_input"]), npy(case["v_input"]), npy(case["queries"])
    outs, mags, smax = npy(case["outputs"]), npy(case["magnitudes"]), npy(case["score_magnitudes"])
    scale = scale_of(case)

    def compare(got, t, out_row, where):
        for i, (begin, end, _) in enumerate(layer.verify_views(t)):
            failures = within(got[i], outs[out_row + i], mags[out_row + i], smax[out_row + i],
                              g["head_dim"], end - begin)
            assert not failures, f"{where} row {i}: " + "; ".join(failures[:5])

    for n, op in enumerate(case["ops"]):
        where = f"op {n} ({op['op']})"
        if op["op"] == "append":
            rows = slice(op["src_row"], op["src_row"] + op["n"])
            layer.append(k[rows], v[rows])
        elif op["op"] == "rewind":
            layer.rewind(op["to"])
        elif op["op"] == "verify":
            t = op["T"]
            drafts = slice(op["src_row"], op["src_row"] + t)
            q = qs[op["q_row"]:op["q_row"] + t]
            layer.reserve(t)
            len_d = layer.len_d
            (layer.append_rows_dcw if windowed else layer.append_rows_dc)(k[drafts], v[drafts])
            assert layer.len_d == len_d, f"{where}: the multi-row append moved len_d"
            layer.inc_seqlen(t)
            assert layer.len_d == op["L"], where
            dev = (layer.decode_rows_dcw if windowed else layer.decode_rows_dc)(q, scale)
            layer.account_steps(t)
            assert dev is not None, f"{where}: {layer.status().message}"
            host = layer.decode_rows(q, scale)
            assert np.array_equal(dev, host), f"{where}: device-counter and host-len differ"
            compare(host, t, op["out_row"], where)
            layer.rewind(op["L"] - t + op["accept"])
        elif op["op"] == "decode_rows":
            t = op["T"]
            q = qs[op["q_row"]:op["q_row"] + t]
            if op["decode"] == "ok":
                compare(layer.decode_rows(q, scale), t, op["out_row"], where)
            else:
                before = state(layer)
                refusal(layer.decode_rows, q, scale)
                assert same_state(state(layer), before), where
        assert (layer.len, layer.base, layer.len_d, layer.base_d) == (
            op["len"], op["base"], op["len"], op["base"]), where
    assert np.array_equal(layer.k_plane.reshape(-1), raw(case["final"]["k_plane"]))
    assert np.array_equal(layer.v_plane.reshape(-1), raw(case["final"]["v_plane"]))


# ---- refusals: the documented messages, state unchanged -------------------------------------------

def rows(n, kv_dim, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((n, kv_dim)).astype(dtype)


def expect_refused(layer, call, message):
    before = state(layer)
    assert refusal(call) == message
    assert same_state(state(layer), before), f"refused ({message}) but the state changed"


def test_documented_refusals_leave_the_layer_unchanged():
    assert refusal(kref.KvLayer, 2, 48, 64, 2) == \
        "geometry: head_dim_k 48 must be a positive multiple of 32 up to 4096"
    flat = kref.KvLayer(1, 64, 102, 2)
    flat.append(rows(100, 64), rows(100, 64, 1))
    expect_refused(flat, lambda: flat.append(rows(5, 64), rows(5, 64)),
                   "append: len 100 + n 5 exceeds max_ctx 102")
    expect_refused(flat, lambda: flat.append(rows(0, 64), rows(0, 64)),
                   "append: n 0 must be at least 1")
    expect_refused(flat, lambda: flat.decode(np.zeros(100, np.float32)),
                   "decode: q has 100 values, expected n_q_heads 2 x head_dim_k 64 = 128")
    expect_refused(flat, lambda: flat.decode_dcw(np.zeros(128, np.float32)),
                   "decode_dcw: the layer has no window; use decode_dc")
    expect_refused(flat, lambda: flat.rewind(101), "rewind: new_len 101 is outside [0, len 100]")
    expect_refused(flat, lambda: flat.physical_rows(10, 120),
                   "physical_rows: [10, 120) is not within the resident rows [0, 102)")
    expect_refused(flat, lambda: flat.decode_rows(np.zeros((17, 2, 64), np.float32)),
                   "decode_rows: T 17 exceeds max_verify 16")
    expect_refused(flat, lambda: flat.restore(flat.snapshot()),
                   "restore: the layer is not fresh (an append, rewind, reserve, device-counter "
                   "step, account_steps or restore was accepted since its construction); restore "
                   "into a newly constructed layer")
    flat.append_dc(rows(1, 64), rows(1, 64))
    flat.inc_seqlen(1)
    expect_refused(flat, flat.snapshot, "snapshot: len_d 101 != len 100 (account for replayed "
                   "device-counter steps with account_steps first)")

    # ring61 of tests/ring/test_ring_reference.cpp: rows 61 + 5 + 3 + 31 = 100.
    ring = kref.KvLayer(2, 32, 1000, 2, window=61, head_dim_v=64, storage="ring", max_append=5,
                        rewind_slack=3)
    assert ring.rows == 100
    while ring.len < 101:
        ring.append(rows(1, 64, ring.len), rows(1, 128, ring.len))
    assert ring.base == 32
    expect_refused(ring, lambda: ring.rewind(91),
                   "rewind: new_len 91 needs logical row 31 resident (the window of the next "
                   "append), below base 32 (the ring already dropped it)")
    expect_refused(ring, lambda: ring.append_dc(rows(1, 64), rows(1, 128)),
                   "append_dc: ring layers use append_dcw")
    expect_refused(ring, lambda: ring.append(rows(40, 64), rows(40, 128)),
                   "append: ring cannot fit n 40 rows: 69 rows must stay resident (from logical "
                   "row 32) and 69 + 40 exceeds rows 100")


def test_binding_refusals_name_the_value_and_leave_the_layer_unchanged():
    layer = kref.KvLayer(2, 64, 50, 4)
    layer.append(rows(3, 128), rows(3, 128, 1))
    expect_refused(layer, lambda: layer.append(rows(2, 128), rows(2, 100)),
                   "append: v has shape (2, 100), expected (n, kv_dim_v 128) or (n, n_kv_heads 2, "
                   "head_dim_v 64)")
    expect_refused(layer, lambda: layer.append(rows(2, 128), rows(3, 128)),
                   "append: k has 2 rows but v has 3")
    expect_refused(layer, lambda: layer.append(rows(2, 128), rows(2, 128, 0, np.float16)),
                   "append: k is float32 but v is float16 (one dtype for both)")
    expect_refused(layer, lambda: layer.append(rows(2, 128, 0, np.float64),
                                               rows(2, 128, 0, np.float64)),
                   "append: k and v are float64, not float32, float16 or bfloat16")
    bits = np.zeros((2, 128), np.uint16)
    expect_refused(layer, lambda: layer.append(bits, bits),
                   "append: k and v are uint16: say what their bits are with dtype='f16' or "
                   "dtype='bf16'")
    expect_refused(layer, lambda: layer.append(bits, bits, dtype="f8"),
                   "append: dtype 'f8' is not 'f32', 'f16' or 'bf16'")
    expect_refused(layer, lambda: layer.append_dc(rows(2, 128), rows(2, 128)),
                   "append_dc: n 2 must be 1")
    expect_refused(layer, lambda: layer.decode(np.zeros((4, 64))),
                   "decode: q has dtype float64, expected float32")
    expect_refused(layer, lambda: layer.decode_rows(np.zeros(256, np.float32)),
                   "decode_rows: q has shape (256,): pass a (T, n_q_heads, head_dim_k) array, or "
                   "T as t=")
    expect_refused(layer, lambda: layer.decode_rows(np.zeros((2, 4, 64), np.float32), t=3),
                   "decode_rows: q has 512 values, expected T 3 x n_q_heads 4 x head_dim_k 64 = "
                   "768")
    assert refusal(kref.KvLayer, 2, 64, 50, 3) == \
        "ref::KvLayer: n_q_heads 3 must be a positive multiple of n_kv_heads 2"
    assert refusal(kref.KvLayer, 2, 64, 50, 4, storage="circular") == \
        "geometry: storage 'circular' is not 'flat' or 'ring'"


def test_account_steps_beyond_reserve_and_device_counter_errors():
    ring = kref.KvLayer(1, 64, 1000, 1, window=40, storage="ring", max_append=8)
    assert ring.rows == 40 + 8 + 31
    ring.append(rows(60, 64), rows(60, 64, 1))
    ring.reserve(2)
    expect_refused(ring, lambda: ring.account_steps(50),
                   f"account_steps: len 60 + k 50 - base {ring.base} exceeds rows 79 (more steps "
                   "than reserve() made room for)")
    # A device-counter step past the plane writes nothing and records a sticky device error.
    for _ in range(40):
        ring.append_dcw(rows(1, 64), rows(1, 64))
        ring.inc_seqlen(1)
    error = ring.status().device_error
    assert error is not None and error.kind == "append_outside_rows"
    assert (error.len_d, error.base_d, error.limit) == (79, 0, 79)
    assert not ring.status()
    assert ring.status().message == (
        "device error: device-counter append at len_d 79, base_d 0: physical row 79 is outside "
        "the plane's 79 rows (call reserve(k) before a chain of k steps); nothing was written")
    ring.clear_status()
    assert ring.status().ok


def test_bf16_and_f16_inputs_quantize_like_their_f32_values():
    x, y = rows(5, 128, 3), rows(5, 128, 4)
    layers = {}
    for name, (k, v, dtype) in {
        "f32": (x, y, None),
        "f16": (x.astype(np.float16), y.astype(np.float16), None),
        "f16bits": (x.astype(np.float16).view(np.uint16), y.astype(np.float16).view(np.uint16),
                    "f16"),
        "bf16bits": (kvlayer.to_bf16_bits(x), kvlayer.to_bf16_bits(y), "bf16"),
    }.items():
        layers[name] = kref.KvLayer(2, 64, 16, 2)
        layers[name].append(k, v, dtype=dtype)
    f16_ref = kref.KvLayer(2, 64, 16, 2)
    f16_ref.append(x.astype(np.float16).astype(np.float32), y.astype(np.float16).astype(np.float32))
    bf16_ref = kref.KvLayer(2, 64, 16, 2)
    bf16_ref.append(kvlayer.from_bf16_bits(kvlayer.to_bf16_bits(x)),
                    kvlayer.from_bf16_bits(kvlayer.to_bf16_bits(y)))
    for name, want in (("f16", f16_ref), ("f16bits", f16_ref), ("bf16bits", bf16_ref)):
        assert np.array_equal(layers[name].k_plane, want.k_plane), name
        assert np.array_equal(layers[name].v_plane, want.v_plane), name
    # f16 differs from f32 somewhere (else the comparisons above could not tell them apart).
    assert not np.array_equal(layers["f16"].k_plane, layers["f32"].k_plane)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    native = kref.KvLayer(2, 64, 16, 2)
    native.append(x.astype(ml_dtypes.bfloat16), y.astype(ml_dtypes.bfloat16))
    assert np.array_equal(native.k_plane, bf16_ref.k_plane)
    assert np.array_equal(kvlayer.to_bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))


# ---- snapshots (SPEC §13) --------------------------------------------------------------------------

def test_snapshot_restores_and_round_trips_through_a_gguf_file(tmp_path):
    src = kref.KvLayer(2, 64, 300, 4, window=40, storage="ring", max_append=16, rewind_slack=4)
    for i in range(9):
        src.append(rows(13, 128, i), rows(13, 128, 100 + i))
    snap = src.snapshot()
    assert (snap.len, snap.first) == (117, 64) and snap.k.shape == (53, src.geometry.k_tok_bytes)
    assert not snap.k.flags.writeable
    path = str(tmp_path / "seq.gguf")
    kvlayer.save_snapshot(path, snap)
    loaded = kvlayer.load_snapshot(path)
    assert np.array_equal(loaded.k, snap.k) and np.array_equal(loaded.v, snap.v)
    assert (loaded.len, loaded.first, loaded.geometry) == (snap.len, snap.first, snap.geometry)
    assert bytes(kvlayer.Snapshot.parse(snap.encode()).encode()) == snap.encode()
    dst = kref.KvLayer.from_geometry(loaded.geometry, 4)
    dst.restore(loaded)
    q = rows(4, 64, 7)
    assert np.array_equal(dst.decode(q), src.decode(q))
    dst.append(rows(3, 128, 50), rows(3, 128, 51))
    src.append(rows(3, 128, 50), rows(3, 128, 51))
    assert np.array_equal(dst.decode(q), src.decode(q))
    # A corrupted file: kind io, naming the file and the CRC.
    data = bytearray(snap.encode())
    data[-5] ^= 0xFF
    (tmp_path / "bad.gguf").write_bytes(bytes(data))
    with pytest.raises(kvlayer.Error) as info:
        kvlayer.load_snapshot(str(tmp_path / "bad.gguf"))
    assert info.value.kind == "io"
    assert str(info.value).startswith(f"load_snapshot: {tmp_path / 'bad.gguf'}: ")
    assert "CRC-32" in str(info.value)


# ---- the oracle of the GPU tests ---------------------------------------------------------------------

def test_numpy_attention_agrees_with_the_reference_decode():
    layer = kref.KvLayer(2, 128, 400, 8, window=150)
    layer.append(rows(230, 256, 1) * 3, rows(230, 256, 2))
    q = rows(8, 128, 3)
    begin, end = layer.view()
    want = layer.decode(q, 0.07)
    got = attention64(layer, q, (begin, end, layer.base), 0.07)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    # The oracle can fail: one key left out moves it far beyond that tolerance.
    off = attention64(layer, q, (begin + 1, end, layer.base), 0.07)
    assert not np.allclose(off, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_decode_bound_is_exposed_and_covers_the_reference_itself():
    layer = kref.KvLayer(2, 64, 200, 8)
    layer.append(rows(150, 128, 5), rows(150, 128, 6))
    q = rows(8, 64, 7)
    shape = kvlayer.AccumulationShape(max_keys_per_split=150, tensor_core=True, pv_mma_steps=10)
    assert not shape.k_fused_f16 and "k_fused_f16=False" in repr(shape)
    b = kref.decode_bound(layer, q, shape)
    # The verify kernel's fused form of rounding point (1): K̃ = fp16(d·q) moves the centre õ.
    fused = kvlayer.AccumulationShape(max_keys_per_split=150, tensor_core=True, pv_mma_steps=10,
                                      k_fused_f16=True)
    bf = kref.decode_bound(layer, q, fused)
    assert "k_fused_f16=True" in repr(fused)
    assert not np.array_equal(bf.rounded, b.rounded) and np.all(bf.bound >= bf.exact_q)
    assert b.bound.shape == (8, 64) and np.all(b.bound > 0)
    # The float64 decode of fp16(q) is exactly e_q from the reference decode.
    assert np.allclose(np.abs(b.rounded - layer.decode(q)), b.exact_q, rtol=0, atol=1e-15)
    assert np.all(b.bound >= b.exact_q)
    # The declared statistical check's model: a scatter far inside the bound's allowance, around
    # a centre within it of the reference.
    assert b.sigma.shape == (8, 64) and np.all(b.sigma > 0)
    assert np.all(b.sigma <= b.bound - b.exact_q)
    assert np.all(np.abs(b.expected - b.rounded) <= b.bound - b.exact_q)
    rb = kref.decode_rows_bound(layer, q.reshape(2, 4, 64)[:, None].repeat(2, 1).reshape(2, 8, 64),
                                shape)
    assert rb.bound.shape == (2, 8, 64) and rb.sigma.shape == (2, 8, 64)
    assert refusal(kref.decode_bound, layer, q, shape, view=(100, 250, 0)) == \
        "decode_bound: view [100, 250) at base 0 is not within the rows [0, 200)"
    tight = kvlayer.BoundTightness()
    tight.record(b.rounded.reshape(-1).copy(), b)
    assert tight.elements == 8 * 64 and tight.summary().startswith("bound tightness:")
