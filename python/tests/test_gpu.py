"""kvlayer.KvLayer on the GPU, with PyTorch tensors, against kvlayer.reference.KvLayer driven in
lock step: planes byte for byte after every append; decode and verify within the bound
ref::decode_bound derives from the layer's launch shape, against a float64 NumPy attention over
the dequantized cache (oracle.py); steps captured with torch.cuda.graph and replayed; refusals
with the documented messages and the layer unchanged; side streams; snapshots both ways.

Skipped, saying why, without PyTorch, without a CUDA device, or when this kvlayer was built
without its CUDA layer (ctest then reports python.gpu as Skipped).
"""

import zlib

import numpy as np
import pytest

import kvlayer
import kvlayer.reference as kref
from conftest import refusal
from oracle import attention64

torch = pytest.importorskip("torch", reason="the GPU tests need PyTorch, which is not installed")
if not torch.cuda.is_available():
    pytest.skip("the GPU tests need a CUDA device; torch sees none", allow_module_level=True)
if not kvlayer.cuda_available():
    pytest.skip("the GPU tests need kvlayer's CUDA layer: " + kvlayer.cuda_unavailable_reason(),
                allow_module_level=True)

DEV = torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="module")
def tightness(request):
    """The bound's tightness over every GPU comparison of this module, printed at its end
    (SPEC §10.6: a comparison reports how much of its allowance it used)."""
    t = kvlayer.BoundTightness()
    yield t
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"test_gpu.py {t.summary()}")


class Pair:
    """A GPU layer and its reference twin, given the same calls."""

    def __init__(self, *args, **kwargs):
        self.gpu = kvlayer.KvLayer(*args, **kwargs)
        kwargs.pop("device", None)
        self.ref = kref.KvLayer(*args, **kwargs)
        self.rng = np.random.default_rng(zlib.crc32((repr(args) + repr(kwargs)).encode()))
        g = self.ref.geometry
        self.kv_dim = g.kv_dim_k

    def rows(self, n, dtype=torch.float16, magnitude=1.0):
        k = (self.rng.standard_normal((n, self.kv_dim)) * magnitude).astype(np.float32)
        v = self.rng.standard_normal((n, self.kv_dim)).astype(np.float32)
        return (torch.from_numpy(k).to(DEV, dtype), torch.from_numpy(v).to(DEV, dtype))

    def append(self, n, dtype=torch.float16, op="append"):
        k, v = self.rows(n, dtype)
        getattr(self.gpu, op)(k, v)
        # bfloat16 reaches NumPy as its uint16 bits (host()), which the reference takes so.
        getattr(self.ref, op)(host(k), host(v), dtype="bf16" if dtype == torch.bfloat16 else None)
        return k, v

    def query(self, t=None):
        shape = (self.gpu.n_q_heads, self.ref.geometry.head_dim_k)
        q = self.rng.uniform(-2, 2, shape if t is None else (t,) + shape).astype(np.float32)
        return torch.from_numpy(q).to(DEV), q

    def same_state(self):
        g, r = self.gpu, self.ref
        assert (g.len, g.base, g.len_d, g.base_d) == (r.len, r.base, r.len_d, r.base_d)
        assert np.array_equal(g.k_plane, r.k_plane), "K planes differ"
        assert np.array_equal(g.v_plane, r.v_plane), "V planes differ"
        assert g.status() == r.status(), f"{g.status()} vs {r.status()}"
        return True


def host(t):
    """A torch tensor's values as NumPy (bfloat16 as its uint16 bits)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def check_within(got, want, bound, what, tightness):
    """|got - want| <= bound element-wise (NaN where the reference is NaN), recorded."""
    got = got.detach().cpu().double().numpy().reshape(want.shape)
    err = np.abs(got - want)
    bad = ~(err <= bound.bound) & ~(np.isnan(want) & np.isnan(got))
    assert not bad.any(), (f"{what}: {int(bad.sum())} elements outside the bound, e.g. got "
                           f"{got[bad][:3]} want {want[bad][:3]} bound {bound.bound[bad][:3]}")
    assert np.isfinite(got[~np.isnan(want)]).all()
    tightness.record(np.ascontiguousarray(got.reshape(-1)), bound)


GEOMETRIES = [
    # (n_kv_heads, head_dim, max_ctx, n_q_heads, keywords)
    (2, 64, 300, 2, {}),
    (2, 128, 700, 8, {"window": 200}),
    (1, 256, 500, 8, {"window": 61, "storage": "ring", "max_append": 64, "rewind_slack": 16}),
    (4, 128, 1200, 64, {}),
]


def ids(p):
    return f"{p[0]}x{p[1]}_nq{p[3]}_{p[4].get('storage', 'flat')}_w{p[4].get('window')}"


@pytest.mark.parametrize("params", GEOMETRIES, ids=ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_appends_write_the_references_bytes(params, dtype):
    n_kv, hd, max_ctx, nq, kw = params
    p = Pair(n_kv, hd, max_ctx, nq, max_verify=16, **kw)
    for n in (1, 17, 64, 3, 33):
        p.append(n, dtype)
        assert p.same_state()


@pytest.mark.parametrize("params", GEOMETRIES, ids=ids)
def test_decode_and_verify_within_the_derived_bound(params, tightness):
    n_kv, hd, max_ctx, nq, kw = params
    p = Pair(n_kv, hd, max_ctx, nq, max_verify=16, **kw)
    for n in (5, 60, 64, 64, 64):
        p.append(n)
        for scale in (None, 0.05):
            q, hq = p.query()
            begin, end = p.ref.view()
            view = (begin, end, p.ref.base)
            want = attention64(p.ref, hq, view, scale)
            bound = kref.decode_bound(p.ref, hq, p.gpu.accumulation_shape(), scale, view)
            out = p.gpu.decode(q, scale=scale)
            check_within(out, want, bound, f"decode at len {p.ref.len}", tightness)
            # The device-counter decode of the same state is bit-identical.
            dc = (p.gpu.decode_dcw if "window" in kw else p.gpu.decode_dc)(q, scale=scale)
            assert torch.equal(dc.view(torch.int32), out.view(torch.int32))
        for t in (1, 4, 16):
            if t > p.ref.len:  # decode_rows needs len >= T
                continue
            q, hq = p.query(t)
            views = p.ref.verify_views(t)
            want = np.stack([attention64(p.ref, hq[i], views[i]) for i in range(t)])
            bound = kref.decode_rows_bound(p.ref, hq, p.gpu.verify_accumulation_shape(t))
            out = p.gpu.decode_rows(q)
            assert out.shape == (t, nq, hd)
            check_within(out, want, bound, f"verify T {t} at len {p.ref.len}", tightness)
    assert p.gpu.status().ok


def test_a_captured_decode_step_replays(tightness):
    """prefill; a step (append_dc, inc_seqlen, decode_dc) captured with torch.cuda.graph and
    replayed with new rows and queries copied into its static inputs; account_steps after."""
    p = Pair(2, 128, 600, 16)
    p.append(100)
    k_in, v_in = p.rows(1)
    q_in, _ = p.query()
    out = torch.empty((16, 128), device=DEV, dtype=torch.float32)

    def step():
        p.gpu.append_dc(k_in, v_in)
        p.gpu.inc_seqlen(1)
        p.gpu.decode_dc(q_in, out)

    def reference_step(hq):
        p.ref.append_dc(host(k_in), host(v_in))
        p.ref.inc_seqlen(1)
        view = (0, p.ref.len_d, 0)
        return attention64(p.ref, hq, view), kref.decode_bound(p.ref, hq,
                                                               p.gpu.accumulation_shape(),
                                                               view=view)

    # One eager step first (what the graph will hold, and the kernels loaded before capture).
    q, hq = p.query()
    q_in.copy_(q)
    step()
    want, bound = reference_step(hq)
    check_within(out, want, bound, "eager step", tightness)
    p.gpu.account_steps(1)
    p.ref.account_steps(1)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # Capturing ran nothing: len_d is where it was.
    assert p.gpu.len_d == p.ref.len_d == 101
    for i in range(40):
        k, v = p.rows(1)
        q, hq = p.query()
        k_in.copy_(k)
        v_in.copy_(v)
        q_in.copy_(q)
        graph.replay()
        want, bound = reference_step(hq)
        check_within(out, want, bound, f"replay {i}", tightness)
        p.gpu.account_steps(1)
        p.ref.account_steps(1)
    assert p.same_state()


def test_a_captured_speculative_step_on_a_ring(tightness):
    """reserve(T) before each replay; append_rows_dcw, inc_seqlen(T), decode_rows_dcw captured;
    account_steps(T) and a rewind keeping the accepted prefix after each replay."""
    t = 4
    p = Pair(2, 64, 5000, 8, window=96, storage="ring", max_append=64, rewind_slack=t)
    for _ in range(3):  # 192 of the ring's 195 rows: the replays' reserve() calls rebase
        p.append(64)
    k_in, v_in = p.rows(t)
    q_in, _ = p.query(t)
    out = torch.empty((t, 8, 64), device=DEV, dtype=torch.float32)

    def step():
        p.gpu.append_rows_dcw(k_in, v_in)
        p.gpu.inc_seqlen(t)
        p.gpu.decode_rows_dcw(q_in, out)

    p.gpu.reserve(t)
    p.ref.reserve(t)
    step()  # eager: the kernels are loaded before capture
    p.ref.append_rows_dcw(host(k_in), host(v_in))
    p.ref.inc_seqlen(t)
    p.gpu.account_steps(t)
    p.ref.account_steps(t)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for i in range(30):
        k, v = p.rows(t)
        q, hq = p.query(t)
        k_in.copy_(k)
        v_in.copy_(v)
        q_in.copy_(q)
        p.gpu.reserve(t)  # a ring rebases here, outside the graph
        p.ref.reserve(t)
        graph.replay()
        p.ref.append_rows_dcw(host(k), host(v))
        p.ref.inc_seqlen(t)
        # Row j sits at len_d - T + j and attends its window, at physical key - base_d.
        views = [(max(0, p.ref.len_d - t + j + 1 - 96), p.ref.len_d - t + j + 1, p.ref.base_d)
                 for j in range(t)]
        want = np.stack([attention64(p.ref, hq[j], views[j]) for j in range(t)])
        bound = kref.decode_rows_bound(p.ref, hq, p.gpu.verify_accumulation_shape(t),
                                       views=views)
        check_within(out, want, bound, f"speculative replay {i}", tightness)
        p.gpu.account_steps(t)
        p.ref.account_steps(t)
        accepted = i % (t + 1)
        assert p.ref.can_rewind_to(p.ref.len - t + accepted)
        p.gpu.rewind(p.gpu.len - t + accepted)
        p.ref.rewind(p.ref.len - t + accepted)
    assert p.ref.base > 0, "no rebase happened: the ring case tested nothing of its own"
    assert p.same_state()


def expect_refused(pair, call, message):
    before = (pair.gpu.len, pair.gpu.base, pair.gpu.len_d, pair.gpu.base_d,
              pair.gpu.k_plane.copy(), pair.gpu.v_plane.copy(), pair.gpu.status())
    assert refusal(call) == message
    after = (pair.gpu.len, pair.gpu.base, pair.gpu.len_d, pair.gpu.base_d,
             pair.gpu.k_plane, pair.gpu.v_plane, pair.gpu.status())
    assert before[:4] == after[:4] and before[6] == after[6], message
    assert np.array_equal(before[4], after[4]) and np.array_equal(before[5], after[5]), message


def test_refusals_carry_the_documented_messages_and_change_nothing():
    unsupported = next(d for d in range(32, 1024, 32) if d not in kvlayer.cuda_head_dims)
    assert refusal(kvlayer.KvLayer, 2, unsupported, 64, 2) == \
        (f"cuda::KvLayer: head_dim {unsupported} is not supported (supported: "
         f"{', '.join(map(str, kvlayer.cuda_head_dims))})")
    assert refusal(kvlayer.KvLayer, 2, 64, 64, 2, max_verify=65) == \
        "cuda::KvLayer: max_verify 65 is not supported (supported: 1..64)"
    p = Pair(1, 64, 102, 2)
    p.append(100)
    k5, v5 = p.rows(5)
    expect_refused(p, lambda: p.gpu.append(k5, v5), "append: len 100 + n 5 exceeds max_ctx 102")
    expect_refused(p, lambda: p.gpu.append(k5.cpu(), v5),
                   f"append: k is on cpu, not on the layer's device cuda:{DEV.index}")
    expect_refused(p, lambda: p.gpu.append(k5.t(), v5.t()),
                   "append: k is not contiguous (strides (1, 64)); pass k.contiguous()")
    # An empty tensor's data pointer is null (PyTorch 2.11, seen on an H100), which the layer
    # checks before the row count.
    expect_refused(p, lambda: p.gpu.append(k5[:0], v5[:0]), "append: k and v must not be null")
    q, _ = p.query()
    expect_refused(p, lambda: p.gpu.decode(q.half()),
                   "decode: q has dtype float16, expected float32")
    expect_refused(p, lambda: p.gpu.decode(q[:1]),
                   "decode: q has 64 values, expected n_q_heads 2 x head_dim_k 64 = 128")
    expect_refused(p, lambda: p.gpu.decode(q, torch.empty(5, device=DEV)),
                   "decode: out has 5 values, expected n_q_heads 2 x head_dim_v 64 = 128")
    expect_refused(p, lambda: p.gpu.decode_dcw(q), "decode_dcw: the layer has no window; use "
                   "decode_dc")
    expect_refused(p, lambda: p.gpu.rewind(101), "rewind: new_len 101 is outside [0, len 100]")
    expect_refused(p, lambda: p.gpu.decode_rows(torch.zeros((17, 2, 64), device=DEV)),
                   "decode_rows: T 17 exceeds max_verify 16")
    p.gpu.close()
    assert refusal(lambda: p.gpu.len) == "kvlayer.KvLayer: the layer is closed"


def test_every_call_runs_on_the_current_stream():
    p = Pair(2, 64, 300, 4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert p.gpu.stream == side.cuda_stream
        k, v = p.rows(50)  # made on the side stream, used there
        p.gpu.append(k, v)
        p.ref.append(host(k), host(v))
        q, hq = p.query()
        out = p.gpu.decode(q)
    torch.cuda.current_stream().wait_stream(side)
    assert p.gpu.stream == torch.cuda.current_stream().cuda_stream
    begin, end = p.ref.view()
    bound = kref.decode_bound(p.ref, hq, p.gpu.accumulation_shape())
    err = np.abs(host(out).astype(np.float64) - attention64(p.ref, hq, (begin, end, 0)))
    assert (err <= bound.bound).all()
    assert p.same_state()


def test_snapshots_cross_between_the_gpu_and_the_reference(tmp_path):
    p = Pair(2, 128, 400, 8, window=50, storage="ring", max_append=32, rewind_slack=4)
    for _ in range(7):
        p.append(29)
    snap = p.gpu.snapshot()
    ref_snap = p.ref.snapshot()
    assert np.array_equal(snap.k, ref_snap.k) and np.array_equal(snap.v, ref_snap.v)
    kvlayer.save_snapshot(str(tmp_path / "s.gguf"), snap)
    back = kvlayer.KvLayer(2, 128, 400, 8, window=50, storage="ring", max_append=32,
                           rewind_slack=4)
    back.restore(kvlayer.load_snapshot(str(tmp_path / "s.gguf")))
    twin = kref.KvLayer.from_geometry(snap.geometry, 8)
    twin.restore(snap)
    assert np.array_equal(back.k_plane, twin.k_plane) and back.len == twin.len == p.ref.len


def test_a_bad_row_is_reported_like_the_reference():
    p = Pair(2, 64, 100, 2)
    p.append(10)
    k, v = p.rows(3, torch.float32)
    k[1, 40] = float("nan")
    p.gpu.append(k, v)
    p.ref.append(host(k), host(v))
    error = p.gpu.status().data_error
    assert error is not None and (error.row, error.plane, error.block) == (11, "K", 1)
    assert p.same_state()
