"""The package's own checks of the arrays and tensors handed to a layer, shared by the
reference (NumPy) and the CUDA layer (PyTorch tensors, __cuda_array_interface__).

Every refusal raises kvlayer.Error (kind "refused") before anything reaches the library, with a
message in the library's style: "<operation>: <what>, <the values>, <the limit>". Checks the
library makes itself (n, T, max_ctx, the ring's room, q's size on the reference, ...) are left
to it, so that its exact messages reach the caller.
"""

import math

from ._errors import Error

# The library's DType codes (kvlayer/dtype.hpp).
F32, F16, BF16 = 0, 1, 2
DTYPE_CODES = {"f32": F32, "f16": F16, "bf16": BF16}

# Element dtypes by name (NumPy's and torch's names agree: float32, float16, bfloat16) and what
# an explicit dtype= may reinterpret (16-bit integers holding f16 or bf16 bits).
_FLOAT_DTYPES = {"float32": F32, "float16": F16, "bfloat16": BF16}
_BITS_DTYPES = ("uint16", "int16")
_ITEMSIZE = {F32: 4, F16: 2, BF16: 2}


def refuse(operation, *parts):
    raise Error(operation + ": " + "".join(str(p) for p in parts), "refused")


def shape_str(shape):
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def row_dtype(operation, k_dtype, v_dtype, dtype):
    """The library's dtype code of a pair of row buffers whose element dtypes are named
    k_dtype / v_dtype (NumPy or torch names); dtype: None (from the buffers) or "f32", "f16",
    "bf16" (required for 16-bit integer bits, and then applied to them)."""
    if k_dtype != v_dtype:
        refuse(operation, "k is ", k_dtype, " but v is ", v_dtype, " (one dtype for both)")
    if dtype is not None:
        if dtype not in DTYPE_CODES:
            refuse(operation, "dtype '", dtype, "' is not 'f32', 'f16' or 'bf16'")
        code = DTYPE_CODES[dtype]
        natural = _FLOAT_DTYPES.get(k_dtype)
        if natural == code or (code != F32 and k_dtype in _BITS_DTYPES):
            return code
        refuse(operation, "dtype '", dtype, "' does not match k and v of dtype ", k_dtype)
    if k_dtype in _FLOAT_DTYPES:
        return _FLOAT_DTYPES[k_dtype]
    if k_dtype in _BITS_DTYPES:
        refuse(operation, "k and v are ", k_dtype, ": say what their bits are with dtype='f16' or "
               "dtype='bf16'")
    refuse(operation, "k and v are ", k_dtype, ", not float32, float16 or bfloat16")


def row_count(operation, name, shape, kv_dim, n_kv_heads, head_dim, which):
    """Rows in a K or V buffer of `shape`: (n, kv_dim), (n, n_kv_heads, head_dim), or one row
    (kv_dim,). Refuses any other shape, naming the expected ones."""
    n = int(shape[0]) if len(shape) >= 2 else 1
    if len(shape) == 0 or math.prod(int(s) for s in shape) != n * kv_dim or (
        len(shape) >= 2 and n == 0 and math.prod(int(s) for s in shape[1:]) != kv_dim
    ):
        refuse(operation, name, " has shape ", shape_str(shape), ", expected (n, kv_dim_", which,
               " ", kv_dim, ") or (n, n_kv_heads ", n_kv_heads, ", head_dim_", which, " ",
               head_dim, ")")
    return n


def rows_n(operation, geometry, k_shape, v_shape):
    """The n of an append of K rows of k_shape and V rows of v_shape (both must agree)."""
    g = geometry
    nk = row_count(operation, "k", k_shape, g.kv_dim_k, g.n_kv_heads, g.head_dim_k, "k")
    nv = row_count(operation, "v", v_shape, g.kv_dim_v, g.n_kv_heads, g.head_dim_v, "v")
    if nk != nv:
        refuse(operation, "k has ", nk, " rows but v has ", nv)
    return nk


def verify_t(operation, shape, t):
    """T of a verify decode: t when given, else the leading dimension of a [T, n_q_heads,
    head_dim] query."""
    if t is not None:
        return int(t)
    if len(shape) != 3:
        refuse(operation, "q has shape ", shape_str(shape), ": pass a (T, n_q_heads, head_dim_k) "
               "array, or T as t=")
    return int(shape[0])


def query_values(operation, name, shape, n_q_heads, head_dim, t, which):
    """Refuses a query (q) or output (out) buffer whose element count is not [T,] n_q_heads ×
    head_dim, in the reference's words (ref::KvLayer checks q so on the CPU)."""
    size = math.prod(int(s) for s in shape)
    want = (t or 1) * n_q_heads * head_dim
    if size != want:
        rows = f"T {t} x " if t is not None else ""
        refuse(operation, name, " has ", size, " values, expected ", rows, "n_q_heads ", n_q_heads,
               " x head_dim_", which, " ", head_dim, " = ", want)


def float32_only(operation, name, dtype_name):
    if dtype_name != "float32":
        refuse(operation, name, " has dtype ", dtype_name, ", expected float32")


def itemsize(code):
    return _ITEMSIZE[code]
