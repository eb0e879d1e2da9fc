"""kvlayer.quantize_q8_0 / quantize_q5_1 / dequantize_*: bytes equal to the C++ reference's (the
committed golden data, which tests/golden checks the C++ quantizers against) and to gguf-py's
(gguf.quants) for finite representable blocks; shapes as gguf.quants gives them; bad input
refused with the value and the limit."""

import numpy as np
import pytest

import kvlayer
from conftest import refusal, require_gguf
from golden_cases import npy, quant_cases, raw

QUANTIZE = {"q8_0": kvlayer.quantize_q8_0, "q5_1": kvlayer.quantize_q5_1}
DEQUANTIZE = {"q8_0": kvlayer.dequantize_q8_0, "q5_1": kvlayer.dequantize_q5_1}
BYTES = {"q8_0": 34, "q5_1": 24}


@pytest.mark.parametrize("fmt", ["q8_0", "q5_1"])
@pytest.mark.parametrize("case", quant_cases(), ids=lambda c: c["name"])
def test_golden_bytes_and_bad_blocks(case, fmt):
    x = npy(case["input"])
    expected = raw(case["formats"][fmt]["expected"]).reshape(-1, BYTES[fmt])
    got, first_bad = QUANTIZE[fmt](x.reshape(-1, 32), first_bad=True)
    assert got.shape == expected.shape and got.dtype == np.uint8
    differ = np.nonzero(np.any(got != expected, axis=1))[0]
    assert differ.size == 0, f"{differ.size} blocks differ, first {differ[:5]}"
    bad = case["formats"][fmt]["bad_blocks"]
    if bad:
        assert first_bad is not None and first_bad[0] == bad[0]["block"]
        value_bits = int(np.array([first_bad[1]], np.float32).view(np.uint32)[0])
        assert value_bits == int(bad[0]["value_bits"], 16)
    else:
        assert first_bad is None


def gguf_inputs():
    """Finite blocks of many scales: no exclusion of golden/test_gguf_crosscheck.py applies (no
    subnormal d, no fp16 overflow, no signed zero at a q5_1 extreme)."""
    rng = np.random.default_rng(20261129)
    blocks = []
    for scale in (1e-3, 0.1, 1.0, 7.5, 300.0, 1e4):
        blocks.append(rng.standard_normal((40, 32)) * scale)
        blocks.append(rng.uniform(-scale, scale, (40, 32)))
        blocks.append(rng.uniform(0.5 * scale, scale, (20, 32)))  # all positive: m > 0
    return np.concatenate(blocks).astype(np.float32)


@pytest.mark.parametrize("fmt", ["q8_0", "q5_1"])
def test_bytes_and_values_equal_gguf_py(fmt):
    gguf = require_gguf()
    from gguf.quants import dequantize, quantize

    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q5_1": gguf.GGMLQuantizationType.Q5_1}[fmt]
    x = gguf_inputs()
    ours = QUANTIZE[fmt](x)
    theirs = quantize(x, qtype)
    assert ours.shape == theirs.shape
    differ = np.nonzero(np.any(ours != theirs, axis=1))[0]
    assert differ.size == 0, f"{differ.size} of {len(x)} blocks differ from gguf-py, first {differ[:5]}"
    assert np.array_equal(DEQUANTIZE[fmt](ours).view(np.uint32),
                          dequantize(theirs, qtype).astype(np.float32).view(np.uint32))
    # The comparison can fail: a one-bit change of the input moves a block's bytes.
    y = x.copy()
    y.view(np.uint32)[3, 0] ^= 1 << 22
    assert not np.array_equal(QUANTIZE[fmt](y)[3], theirs[3])


def test_shapes_follow_gguf_and_16_bit_inputs_widen_exactly():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 96)).astype(np.float32)
    q8, q5 = kvlayer.quantize_q8_0(x), kvlayer.quantize_q5_1(x)
    assert q8.shape == (3, 4, 3 * 34) and q5.shape == (3, 4, 3 * 24)
    assert kvlayer.dequantize_q8_0(q8).shape == x.shape
    assert np.array_equal(kvlayer.quantize_q8_0(x.reshape(-1, 32)).reshape(q8.shape), q8)
    h = x.astype(np.float16)
    assert np.array_equal(kvlayer.quantize_q5_1(h), kvlayer.quantize_q5_1(h.astype(np.float32)))
    # Dequantized values are within d (1/2 + 127 * 2^-11) of the input: the quants are rounded
    # against the f32 d = amax / 127 (as ggml does), then d is stored rounded to fp16.
    d = q8.reshape(3, 4, 3, 34)[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    err = np.abs(kvlayer.dequantize_q8_0(q8) - x).reshape(3, 4, 3, 32)
    assert np.all(err <= d[..., None] * (0.5 + 127 * 2.0 ** -11))
    assert np.all(err.max(axis=-1) > 0)  # not trivially exact


def test_bad_input_is_refused_with_the_value_and_the_limit():
    assert refusal(kvlayer.quantize_q8_0, np.zeros((2, 40), np.float32)) == \
        "quantize_q8_0: x has shape (2, 40): the last dimension must be a multiple of 32"
    assert refusal(kvlayer.quantize_q5_1, np.zeros(64)) == (
        "quantize_q5_1: x has dtype float64, expected float32, float16 or bfloat16 (convert "
        "explicitly: a float64 would be rounded)")
    assert refusal(kvlayer.dequantize_q5_1, np.zeros(50, np.uint8)) == (
        "dequantize_q5_1: data has shape (50,): the last dimension must be a multiple of the q5_1 "
        "block's 24 bytes")
    assert refusal(kvlayer.dequantize_q8_0, np.zeros(34, np.int8)) == \
        "dequantize_q8_0: data has dtype int8, expected uint8"


def test_bf16_conversion_rounds_to_nearest_even():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, np.inf, 65504.0], np.float32)
    bits = kvlayer.to_bf16_bits(x)
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1.0); 1 + 3·2^-8 rounds up to 1 + 2^-6.
    assert list(kvlayer.from_bf16_bits(bits)) == [1.0, 1.0, 1.0 + 2 ** -6, -2.5, np.inf, 65536.0]
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(9)
    y = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-30, 30, 4096)).astype(np.float32)
    assert np.array_equal(kvlayer.to_bf16_bits(y), y.astype(ml_dtypes.bfloat16).view(np.uint16))
