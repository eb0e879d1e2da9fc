"""kvlayer.reference: the CPU reference layer (ref::KvLayer, the executable specification) with
NumPy arrays in and out, and the accuracy bound of a GPU decode (ref::decode_bound).

    import numpy as np, kvlayer.reference as kref
    layer = kref.KvLayer(n_kv_heads=2, head_dim=64, max_ctx=256, n_q_heads=8)
    layer.append(k, v)                  # k, v: (n, 2 * 64) or (n, 2, 64), float32/float16/bf16
    out = layer.decode(q)               # q: (8, 64) float32 -> (8, 64) float64

Every call either completes or raises kvlayer.Error (kind "refused") with the library's message,
leaving the layer exactly as it was.
"""

import numpy as np

from . import _checks, _kvlayer
from ._geometry import make_geometry

__all__ = ["KvLayer", "decode_bound", "decode_rows_bound", "DEFAULT_MAX_VERIFY"]

DEFAULT_MAX_VERIFY = 16


def _dtype_name(a):
    return a.dtype.name


def _host_rows(a):
    """A C-contiguous uint8 view of a row buffer (bfloat16 and float16 cross as their bytes)."""
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def _query(operation, q):
    q = np.asarray(q)
    _checks.float32_only(operation, "q", q.dtype.name)
    return np.ascontiguousarray(q).reshape(-1)


class KvLayer:
    """The reference KvLayer (SPEC §5-9, §11, §13): the same calls as kvlayer.KvLayer, on NumPy.

    Arguments as kvlayer.KvLayer's: n_kv_heads, head_dim (K and V; head_dim_v= for another V
    head dim), max_ctx, n_q_heads, window (None: attend every row), max_verify (the largest T of
    a multi-row step or verify decode); storage="ring" keeps a windowed layer in a compacting
    ring of window + max_append + rewind_slack + 31 rows.
    """

    def __init__(self, n_kv_heads, head_dim, max_ctx, n_q_heads, window=None,
                 max_verify=DEFAULT_MAX_VERIFY, *, head_dim_v=None, storage="flat",
                 max_append=1, rewind_slack=0):
        g = make_geometry(n_kv_heads, head_dim, max_ctx, window, head_dim_v=head_dim_v,
                          storage=storage, max_append=max_append, rewind_slack=rewind_slack)
        self._l = _kvlayer.RefLayer(g, n_q_heads, max_verify)

    @classmethod
    def from_geometry(cls, geometry, n_q_heads, max_verify=DEFAULT_MAX_VERIFY):
        """A layer of an existing kvlayer.Geometry (e.g. a snapshot's)."""
        self = cls.__new__(cls)
        self._l = _kvlayer.RefLayer(geometry, n_q_heads, max_verify)
        return self

    # ---- appends (SPEC §5-7, §11) -------------------------------------------------------------

    def _append(self, operation, k, v, dtype):
        k = np.asarray(k)
        v = np.asarray(v)
        code = _checks.row_dtype(operation, _dtype_name(k), _dtype_name(v), dtype)
        n = _checks.rows_n(operation, self.geometry, k.shape, v.shape)
        self._l.append_op(operation, _host_rows(k), _host_rows(v), n, code)

    def append(self, k, v, dtype=None):
        """Quantizes and appends n rows: k (n, kv_dim_k), v (n, kv_dim_v) (or (n, n_kv_heads,
        head_dim); one row may be 1-D) of float32, float16 or bfloat16 (ml_dtypes), or uint16
        bits with dtype="f16"/"bf16". len += n; a ring rebases first when it must."""
        self._append("append", k, v, dtype)

    def append_dc(self, k, v, dtype=None):
        """Device-counter append of one row at len_d (flat layers)."""
        self._append("append_dc", k, v, dtype)

    def append_dcw(self, k, v, dtype=None):
        """Device-counter append of one row at len_d - base_d."""
        self._append("append_dcw", k, v, dtype)

    def append_rows_dc(self, k, v, dtype=None):
        """Device-counter append of T draft rows at len_d ... (flat layers; SPEC §11)."""
        self._append("append_rows_dc", k, v, dtype)

    def append_rows_dcw(self, k, v, dtype=None):
        """Device-counter append of T draft rows at len_d - base_d ..."""
        self._append("append_rows_dcw", k, v, dtype)

    def inc_seqlen(self, t=1):
        """len_d += t (1 <= t <= max_verify)."""
        self._l.inc_seqlen(t)

    def account_steps(self, k):
        """len += k after k replayed device-counter steps."""
        self._l.account_steps(k)

    def rewind(self, new_len):
        """len = len_d = new_len (bytes untouched)."""
        self._l.rewind(new_len)

    def reserve(self, k):
        """Makes the next k single-row appends contiguous, rebasing a ring now if needed."""
        self._l.reserve(k)

    def can_rewind_to(self, p):
        return self._l.can_rewind_to(p)

    def physical_rows(self, start, end):
        return self._l.physical_rows(start, end)

    def view(self):
        """The logical rows [begin, end) decode() attends."""
        return self._l.view()

    def verify_views(self, t):
        """The (begin, end, base) each of the T rows of decode_rows() attends."""
        return self._l.verify_views(t)

    # ---- decode (SPEC §8, §11): float64 over the dequantized cache ------------------------------

    def decode(self, q, scale=None):
        """Attention of q (n_q_heads, head_dim_k) float32 over view(): (n_q_heads, head_dim_v)
        float64. scale defaults to 1/sqrt(head_dim_k) in f32."""
        return self._l.decode(_query("decode", q), scale)

    def decode_dc(self, q, scale=None):
        """Device-counter decode over [0, len_d); None when it records a device error."""
        return self._l.decode_dc(_query("decode_dc", q), scale)

    def decode_dcw(self, q, scale=None):
        """Device-counter decode over the window ending at len_d; None on a device error."""
        return self._l.decode_dcw(_query("decode_dcw", q), scale)

    def decode_rows(self, q, scale=None, t=None):
        """Verify decode: q (T, n_q_heads, head_dim_k) float32 (or any shape with t=T); row i
        sits at len - T + i. Returns (T, n_q_heads, head_dim_v) float64."""
        t = _checks.verify_t("decode_rows", np.shape(q), t)
        return self._l.decode_rows(_query("decode_rows", q), t, scale)

    def decode_rows_dc(self, q, scale=None, t=None):
        t = _checks.verify_t("decode_rows_dc", np.shape(q), t)
        return self._l.decode_rows_dc(_query("decode_rows_dc", q), t, scale)

    def decode_rows_dcw(self, q, scale=None, t=None):
        t = _checks.verify_t("decode_rows_dcw", np.shape(q), t)
        return self._l.decode_rows_dcw(_query("decode_rows_dcw", q), t, scale)

    # ---- snapshot (SPEC §13), status, state -------------------------------------------------------

    def snapshot(self):
        """The live rows as a kvlayer.Snapshot (refused while len_d != len)."""
        return self._l.snapshot()

    def restore(self, snapshot):
        """Restores a snapshot into this fresh layer."""
        self._l.restore(snapshot)

    @property
    def fresh(self):
        return self._l.fresh

    def status(self):
        """The sticky errors (kvlayer.LayerStatus; truthy when ok)."""
        return self._l.status()

    def clear_status(self):
        self._l.clear_status()

    len = property(lambda self: self._l.len, doc="host len: logical rows appended")
    base = property(lambda self: self._l.base, doc="host base: logical row at physical row 0")
    len_d = property(lambda self: self._l.len_d, doc="the device counter len_d (modelled)")
    base_d = property(lambda self: self._l.base_d, doc="the device counter base_d (modelled)")
    rows = property(lambda self: self._l.rows, doc="physical rows of each plane")
    max_verify = property(lambda self: self._l.max_verify)
    n_q_heads = property(lambda self: self._l.n_q_heads)
    geometry = property(lambda self: self._l.geometry)
    k_plane = property(lambda self: self._l.k_plane,
                       doc="the K plane, (rows, k_tok_bytes) uint8 q8_0 blocks: a live read-only view")
    v_plane = property(lambda self: self._l.v_plane,
                       doc="the V plane, (rows, v_tok_bytes) uint8 q5_1 blocks: a live read-only view")

    def __repr__(self):
        return (f"<kvlayer.reference.KvLayer {self.geometry.describe()} n_q_heads {self.n_q_heads}"
                f" len {self.len} base {self.base}>")


def decode_bound(layer, q, shape, scale=None, view=None):
    """ref::decode_bound: the per-element bound on |GPU - float64 reference| of a decode of q
    over `view` of the reference `layer` by a GPU whose launch has accumulation `shape`
    (kvlayer.KvLayer.accumulation_shape()). view: (begin, end, base); default the layer's
    host-len view at its base. Returns a kvlayer.DecodeBound of (n_q_heads, head_dim_v) arrays."""
    if view is None:
        begin, end = layer.view()
        view = (begin, end, layer.base)
    begin, end, base = view
    return layer._l.decode_bound(_query("decode_bound", q), shape, scale, begin, end, base)


def decode_rows_bound(layer, q, shape, scale=None, t=None, views=None):
    """ref::decode_rows_bound: the bound of each row of a verify decode of q (T, n_q_heads,
    head_dim_k), shape = kvlayer.KvLayer.verify_accumulation_shape(T); views default to the
    layer's verify_views(T). Arrays of (T, n_q_heads, head_dim_v)."""
    t = _checks.verify_t("decode_rows_bound", np.shape(q), t)
    if views is None:
        views = layer.verify_views(t)
    return layer._l.decode_rows_bound(_query("decode_rows_bound", q), shape, scale, list(views))
