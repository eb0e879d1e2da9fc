"""The q8_0 / q5_1 block quantizers for NumPy (SPEC §2-4), byte-identical to the library's and,
for every finite representable block, to ggml's (gguf-py's gguf.quants).

Shapes follow gguf.quants: quantizing (..., n) values (n a multiple of 32) gives (..., n / 32 *
34) bytes for q8_0 and (..., n / 32 * 24) for q5_1; dequantizing reverses that.
"""

import numpy as np

from . import _checks, _kvlayer

BLOCK_VALUES = 32
BLOCK_BYTES = {"q8_0": 34, "q5_1": 24}

_INPUT_DTYPES = ("float32", "float16", "bfloat16")


def _quantize(fmt, x, first_bad):
    op = "quantize_" + fmt
    x = np.asarray(x)
    if x.dtype.name not in _INPUT_DTYPES:
        _checks.refuse(op, "x has dtype ", x.dtype.name, ", expected float32, float16 or bfloat16 "
                       "(convert explicitly: a float64 would be rounded)")
    if x.ndim == 0 or x.shape[-1] % BLOCK_VALUES != 0:
        _checks.refuse(op, "x has shape ", _checks.shape_str(x.shape), ": the last dimension must "
                       "be a multiple of ", BLOCK_VALUES)
    # float16 and bfloat16 widen to float32 exactly: the library quantizes f32 values.
    values = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    data, bad = _kvlayer.quantize_row(fmt, values)
    out = data.reshape(x.shape[:-1] + (x.shape[-1] // BLOCK_VALUES * BLOCK_BYTES[fmt],))
    return (out, bad) if first_bad else out


def _dequantize(fmt, data):
    op = "dequantize_" + fmt
    data = np.asarray(data)
    if data.dtype != np.uint8:
        _checks.refuse(op, "data has dtype ", data.dtype.name, ", expected uint8")
    if data.ndim == 0 or data.shape[-1] % BLOCK_BYTES[fmt] != 0:
        _checks.refuse(op, "data has shape ", _checks.shape_str(data.shape), ": the last dimension "
                       "must be a multiple of the ", fmt, " block's ", BLOCK_BYTES[fmt], " bytes")
    out = _kvlayer.dequantize_row(fmt, np.ascontiguousarray(data).reshape(-1))
    return out.reshape(data.shape[:-1] + (data.shape[-1] // BLOCK_BYTES[fmt] * BLOCK_VALUES,))


def quantize_q8_0(x, first_bad=False):
    """q8_0 blocks (34 bytes: fp16 d, 32 int8 quants) of x (..., n), n a multiple of 32, of
    float32, float16 or bfloat16. A block that cannot be represented (NaN, ±Inf, fp16 overflow of
    d) is written as the canonical bad block; first_bad=True also returns (block, value) of the
    first such block (blocks numbered over the flattened input) or None."""
    return _quantize("q8_0", x, first_bad)


def quantize_q5_1(x, first_bad=False):
    """q5_1 blocks (24 bytes: fp16 d and m, 32 5-bit quants) of x; as quantize_q8_0."""
    return _quantize("q5_1", x, first_bad)


def dequantize_q8_0(data):
    """float32 values of q8_0 blocks: uint8 (..., 34 k) -> (..., 32 k); x_j = f32(d) q_j."""
    return _dequantize("q8_0", data)


def dequantize_q5_1(data):
    """float32 values of q5_1 blocks: uint8 (..., 24 k) -> (..., 32 k); x_j = f32(d) q_j + f32(m)."""
    return _dequantize("q5_1", data)


def to_bf16_bits(x):
    """bfloat16 bits (uint16) of float32 x, rounded to nearest even as kvlayer rounds: append's
    dtype="bf16" input without ml_dtypes."""
    x = np.asarray(x)
    _checks.float32_only("to_bf16_bits", "x", x.dtype.name)
    return _kvlayer.f32_to_bf16_bits(np.ascontiguousarray(x).reshape(-1)).reshape(x.shape)


def from_bf16_bits(bits):
    """float32 values of bfloat16 bits (exact)."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        _checks.refuse("from_bf16_bits", "bits has dtype ", bits.dtype.name, ", expected uint16")
    return _kvlayer.bf16_bits_to_f32(np.ascontiguousarray(bits).reshape(-1)).reshape(bits.shape)
