"""kvlayer.KvLayer: the CUDA layer (cuda::KvLayer) over PyTorch tensors, CuPy arrays or anything
with __cuda_array_interface__, without copies, on the current torch CUDA stream.

Tensors cross as device pointers (data_ptr()), never through DLPack: torch's __dlpack__() makes
the legacy default stream wait on the current one, which breaks a torch.cuda.graph capture.
Every call runs on a stream chosen when it is made: the stream given to the constructor, else
torch.cuda.current_stream(layer's device) when torch is imported, else CuPy's current stream
when CuPy is, else the legacy default stream. Inside `with torch.cuda.graph(g):` that is the
capture stream, so the device-counter calls are captured and g.replay() replays them.

The caller orders streams as PyTorch asks of any kernel: a tensor written on one stream and
handed to a call on another needs an event or a synchronization between them.
"""

import sys

from . import _checks, _kvlayer
from ._errors import Error
from ._geometry import make_geometry

__all__ = ["KvLayer", "cuda_available", "cuda_unavailable_reason"]

DEFAULT_MAX_VERIFY = 16

# __cuda_array_interface__ type strings (without the byte-order character) -> dtype names.
_TYPESTR = {"f4": "float32", "f2": "float16", "u2": "uint16", "i2": "int16", "f8": "float64"}
# cudaMemoryType values of device memory (cudaMemoryTypeDevice, cudaMemoryTypeManaged).
_DEVICE_MEMORY = (2, 3)


def cuda_unavailable_reason():
    """None when kvlayer.KvLayer can be constructed here, else why not (built without the CUDA
    layer, or no CUDA device visible)."""
    if not _kvlayer.cuda_built:
        return ("this kvlayer was built without its CUDA layer (nvcc was not found when it was "
                "built, or KVLAYER_PYTHON_CUDA was OFF); the reference layer "
                "(kvlayer.reference.KvLayer) and the quantizers work")
    n, err = _kvlayer.cuda_device_count()
    if n == 0:
        return "no CUDA device is visible (" + (err or "cudaGetDeviceCount found 0 devices") + ")"
    return None


def cuda_available():
    """True when kvlayer.KvLayer can be constructed here."""
    return cuda_unavailable_reason() is None


def _refuse(operation, *parts):
    _checks.refuse(operation, *parts)


def _device_index(device):
    """The CUDA device index of `device`: None (torch's current device, else the CUDA runtime's),
    an int, "cuda" / "cuda:N", or a torch.device."""
    op = "kvlayer.KvLayer"
    torch = sys.modules.get("torch")
    if device is None:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_device()
        return _kvlayer.cuda_current_device()
    if isinstance(device, str):
        if device == "cuda":
            return _device_index(None)
        if device.startswith("cuda:") and device[5:].isdigit():
            index = int(device[5:])
        else:
            _refuse(op, "device '", device, "' is not 'cuda' or 'cuda:N'")
    elif isinstance(device, int):
        index = device
    elif hasattr(device, "type") and hasattr(device, "index"):  # torch.device
        if device.type != "cuda":
            _refuse(op, "device ", device, " is not a CUDA device")
        return _device_index(None) if device.index is None else _device_index(device.index)
    else:
        _refuse(op, "device ", repr(device), " is not an int, 'cuda:N' or a torch.device")
    n, _ = _kvlayer.cuda_device_count()
    if not 0 <= index < n:
        _refuse(op, "device ", index, " does not exist (", n, " CUDA devices visible)")
    return index


def _stream_value(stream):
    """The cudaStream_t handle (an int) of an explicit stream: an int, a torch.cuda.Stream
    (.cuda_stream) or a CuPy stream (.ptr)."""
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    _refuse("kvlayer.KvLayer", "stream ", repr(stream), " is not an int handle, a "
            "torch.cuda.Stream or a CuPy stream")


def _buffer(operation, name, x, device):
    """(device pointer, shape, dtype name) of a CUDA tensor on `device`, refusing anything else
    (host memory, another device, a strided view) before the library sees the pointer."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cuda" or x.device.index != device:
            _refuse(operation, name, " is on ", x.device, ", not on the layer's device cuda:", device)
        if not x.is_contiguous():
            _refuse(operation, name, " is not contiguous (strides ", tuple(x.stride()), "); pass ",
                    name, ".contiguous()")
        return x.data_ptr(), tuple(x.shape), str(x.dtype).replace("torch.", "")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        _refuse(operation, name, " is a ", type(x).__name__, ", not a CUDA tensor (a torch.Tensor "
                "on the layer's device, or an object with __cuda_array_interface__)")
    ptr = int(cai["data"][0])
    shape = tuple(int(s) for s in cai["shape"])
    typestr = cai["typestr"]
    dtype = _TYPESTR.get(typestr[1:], typestr)
    strides = cai.get("strides")
    if strides is not None:
        item = int(typestr[2:])
        expected, step = [], item
        for s in reversed(shape):
            expected.append(step)
            step *= s
        if tuple(strides) != tuple(reversed(expected)) and 0 not in shape:
            _refuse(operation, name, " is not contiguous (strides ", tuple(strides), ")")
    if ptr != 0:
        memory, on = _kvlayer.cuda_pointer_device(ptr)
        if memory not in _DEVICE_MEMORY or on != device:
            where = f"device {on}" if memory in _DEVICE_MEMORY else "host memory"
            _refuse(operation, name, " is in ", where, ", not on the layer's device cuda:", device)
    return ptr, shape, dtype


class KvLayer:
    """The KV cache of one attention layer on the GPU: K as q8_0, V as q5_1 (cuda::KvLayer).

    KvLayer(n_kv_heads, head_dim, max_ctx, n_q_heads, window=None, max_verify=16, device=None,
    *, stream=None, storage="flat", max_append=1, rewind_slack=0)

    head_dim is one of kvlayer.cuda_head_dims (K and V alike); n_q_heads a multiple of
    n_kv_heads, at most 16 times it; window None attends every row; max_verify (1..64) the
    largest T of a speculative step. storage="ring" keeps a windowed layer in a compacting ring
    of window + max_append + rewind_slack + 31 rows (max_append: the largest single append, e.g.
    the prefill chunk).
    device: None (torch's current device), an index, "cuda:N" or a torch.device. stream: None
    (each call on the current stream, see the module's doc) or a fixed stream.

    Rows and queries are CUDA tensors on the layer's device, contiguous: K/V rows (n, n_kv_heads
    * head_dim) or (n, n_kv_heads, head_dim) of float32, float16 or bfloat16; queries and outputs
    float32 (n_q_heads, head_dim), or (T, n_q_heads, head_dim) for a verify. Refusals raise
    kvlayer.Error (kind "refused") with the library's message and leave the layer as it was;
    CUDA failures raise it with kind "device".
    """

    def __init__(self, n_kv_heads, head_dim, max_ctx, n_q_heads, window=None,
                 max_verify=DEFAULT_MAX_VERIFY, device=None, *, stream=None, storage="flat",
                 max_append=1, rewind_slack=0):
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise Error("kvlayer.KvLayer: the CUDA layer is unavailable: " + reason, "unavailable")
        self._device = _device_index(device)
        self._stream_object = stream  # kept alive while the layer may use it
        self._fixed_stream = None if stream is None else _stream_value(stream)
        g = make_geometry(n_kv_heads, head_dim, max_ctx, window, storage=storage,
                          max_append=max_append, rewind_slack=rewind_slack)
        self._l = _kvlayer.CudaLayer(g, n_q_heads, max_verify, self._device, self._stream())
        # Host copies of what every call's checks read (no call into the library for them).
        self._geometry = self._l.geometry
        self._n_q_heads = n_q_heads

    def _stream(self):
        if self._fixed_stream is not None:
            return self._fixed_stream
        torch = sys.modules.get("torch")
        if torch is not None:
            return torch.cuda.current_stream(self._device).cuda_stream
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return cupy.cuda.get_current_stream().ptr
        return 0  # the legacy default stream

    # ---- appends (SPEC §5-7, §11) -------------------------------------------------------------

    def _append(self, operation, k, v, dtype):
        kp, ks, kd = _buffer(operation, "k", k, self._device)
        vp, vs, vd = _buffer(operation, "v", v, self._device)
        code = _checks.row_dtype(operation, kd, vd, dtype)
        n = _checks.rows_n(operation, self._geometry, ks, vs)
        self._l.append_op(operation, kp, vp, n, code, self._stream())

    def append(self, k, v, dtype=None):
        """Quantizes and appends n rows (host len += n; a ring rebases first when it must).
        dtype: None (from the tensors), or "f16"/"bf16" for 16-bit integer bits. Not
        capturable (it plans on the host's len)."""
        self._append("append", k, v, dtype)

    def append_dc(self, k, v, dtype=None):
        """Writes one row at len_d (flat layers); capturable. A row past max_ctx writes nothing
        and is reported by status()."""
        self._append("append_dc", k, v, dtype)

    def append_dcw(self, k, v, dtype=None):
        """Writes one row at len_d - base_d (any layer; rings need reserve() first); capturable."""
        self._append("append_dcw", k, v, dtype)

    def append_rows_dc(self, k, v, dtype=None):
        """Writes T draft rows at len_d ... (flat layers; SPEC §11); capturable."""
        self._append("append_rows_dc", k, v, dtype)

    def append_rows_dcw(self, k, v, dtype=None):
        """Writes T draft rows at len_d - base_d ...; capturable."""
        self._append("append_rows_dcw", k, v, dtype)

    def inc_seqlen(self, t=1):
        """len_d += t on the device (1 <= t <= max_verify); capturable."""
        self._l.inc_seqlen(t, self._stream())

    def account_steps(self, k):
        """Host len += k after k replayed device-counter steps (enqueues nothing)."""
        self._l.account_steps(k)

    def rewind(self, new_len):
        """len = len_d = new_len; bytes untouched."""
        self._l.rewind(new_len, self._stream())

    def reserve(self, k):
        """Makes the next k single-row appends contiguous, rebasing a ring now if needed: call it
        before capturing or replaying k windowed device-counter steps on a ring."""
        self._l.reserve(k, self._stream())

    def can_rewind_to(self, p):
        return self._l.can_rewind_to(p)

    def physical_rows(self, start, end):
        return self._l.physical_rows(start, end)

    def view(self):
        """The logical rows [begin, end) decode() attends (host len)."""
        return self._l.view()

    # ---- decode (SPEC §8, §11) ---------------------------------------------------------------------

    def _decode(self, operation, q, out, scale, t):
        g = self._geometry
        qp, qs, qd = _buffer(operation, "q", q, self._device)
        _checks.float32_only(operation, "q", qd)
        _checks.query_values(operation, "q", qs, self._n_q_heads, g.head_dim_k, t, "k")
        if out is None:
            out = self._new_output(operation, q, t)
        op, os_, od = _buffer(operation, "out", out, self._device)
        _checks.float32_only(operation, "out", od)
        _checks.query_values(operation, "out", os_, self._n_q_heads, g.head_dim_v, t, "v")
        self._l.decode_op(operation, qp, op, 0 if t is None else t, scale, self._stream())
        return out

    def _new_output(self, operation, q, t):
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(q, torch.Tensor):
            _refuse(operation, "pass out= (q is not a torch.Tensor, so no output can be allocated)")
        shape = (self._n_q_heads, self._geometry.head_dim_v)
        return torch.empty(shape if t is None else (t,) + shape, dtype=torch.float32,
                           device=q.device)

    def decode(self, q, out=None, scale=None):
        """Attention of q (n_q_heads, head_dim) float32 over view(), into out (allocated when
        None; inside a graph capture, from the graph's pool). scale defaults to
        1/sqrt(head_dim). Not capturable (host len)."""
        return self._decode("decode", q, out, scale, None)

    def decode_dc(self, q, out=None, scale=None):
        """Decode over [0, len_d) (flat layers without a window); capturable."""
        return self._decode("decode_dc", q, out, scale, None)

    def decode_dcw(self, q, out=None, scale=None):
        """Decode over the window ending at len_d, at physical key - base_d; capturable."""
        return self._decode("decode_dcw", q, out, scale, None)

    def decode_rows(self, q, out=None, scale=None, t=None):
        """Verify decode of T queries q (T, n_q_heads, head_dim): row i sits at len - T + i and
        attends its own causal (and windowed) view. Host len; not capturable."""
        t = _checks.verify_t("decode_rows", _shape(q), t)
        return self._decode("decode_rows", q, out, scale, t)

    def decode_rows_dc(self, q, out=None, scale=None, t=None):
        """Verify decode over L = len_d (flat, window-less layers); capturable (T fixed)."""
        t = _checks.verify_t("decode_rows_dc", _shape(q), t)
        return self._decode("decode_rows_dc", q, out, scale, t)

    def decode_rows_dcw(self, q, out=None, scale=None, t=None):
        """Verify decode over L = len_d at physical key - base_d (windowed layers); capturable."""
        t = _checks.verify_t("decode_rows_dcw", _shape(q), t)
        return self._decode("decode_rows_dcw", q, out, scale, t)

    # ---- the accuracy contract (SPEC §8) ------------------------------------------------------------

    def accumulation_shape(self):
        """The decode's launch shape, for kvlayer.reference.decode_bound()."""
        return self._l.accumulation_shape()

    def verify_accumulation_shape(self, t):
        """A verify decode's launch shape for T queries, for kvlayer.reference.decode_rows_bound()."""
        return self._l.verify_accumulation_shape(t)

    def default_scale(self):
        return self._l.default_scale()

    def decode_plan(self):
        """The decode grid fixed at construction (kernel, splits, keys per split, scratch)."""
        return self._l.decode_plan()

    # ---- snapshot (SPEC §13), status, read-back: these synchronize the stream ------------------------

    def snapshot(self):
        """The live rows as a kvlayer.Snapshot (refused while len_d != len)."""
        return self._l.snapshot(self._stream())

    def restore(self, snapshot):
        """Restores a snapshot (from either layer, or load_snapshot) into this fresh layer."""
        self._l.restore(snapshot, self._stream())

    def status(self):
        """The sticky errors recorded on the device (kvlayer.LayerStatus; truthy when ok)."""
        return self._l.status(self._stream())

    def clear_status(self):
        self._l.clear_status(self._stream())

    @property
    def fresh(self):
        return self._l.fresh

    @property
    def len(self):
        """Host len (no synchronization)."""
        return self._l.len

    @property
    def base(self):
        """Host base (no synchronization)."""
        return self._l.base

    @property
    def len_d(self):
        """The device counter len_d, read back (synchronizes)."""
        return self._l.read_len_d(self._stream())

    @property
    def base_d(self):
        """The device counter base_d, read back (synchronizes)."""
        return self._l.read_base_d(self._stream())

    @property
    def k_plane(self):
        """A host copy of the K plane, (rows, k_tok_bytes) uint8 q8_0 blocks, read-only
        (synchronizes). A copy, not a view: torch has no read-only tensors, and a writable view
        of the live plane would let a caller corrupt it."""
        return self._l.k_plane(self._stream())

    @property
    def v_plane(self):
        """A host copy of the V plane, (rows, v_tok_bytes) uint8 q5_1 blocks (as k_plane)."""
        return self._l.v_plane(self._stream())

    rows = property(lambda self: self._l.rows, doc="physical rows of each plane")
    max_verify = property(lambda self: self._l.max_verify)
    n_q_heads = property(lambda self: self._n_q_heads)
    geometry = property(lambda self: self._l.geometry)
    device = property(lambda self: self._device, doc="the CUDA device index of the layer")

    @property
    def stream(self):
        """The stream the next call runs on (an int handle)."""
        return self._stream()

    def close(self):
        """Waits for the layer's work on the current stream and frees its device memory; later
        calls are refused. Dropping the last reference does the same."""
        self._l.close(self._stream())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<kvlayer.KvLayer {self._geometry.describe()} n_q_heads {self._n_q_heads} "
                f"cuda:{self._device}>")


def _shape(x):
    cai = None if hasattr(x, "shape") else getattr(x, "__cuda_array_interface__", None)
    return tuple(cai["shape"]) if cai is not None else tuple(x.shape)
