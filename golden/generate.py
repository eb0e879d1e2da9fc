#!/usr/bin/env python3
"""Golden data generator for kvlayer (SPEC §2-8, §11), NumPy only.

Writes golden/data/ (or --out DIR): quantization cases (f32 inputs and the expected q8_0 / q5_1
bytes, with the bad blocks and the value each is reported with), decode cases (geometry, a
sequence of appends and rewinds, the query, the float64 attention output after every operation,
and the final K / V planes with len and base) and verify cases (speculative steps of SPEC §11:
T draft rows appended at once, the float64 output of each of the T query rows over its own
causal window, the accepted prefix kept by a rewind), plus manifest.json describing every file
(shape, dtype, seed, sha256) and every case. The verify cases and their files are listed under
the manifest's "verify" key, apart from "files" and "cases", which list the SPEC §2-8 data.

This is an *independent* implementation of the spec: nothing here is imported from, or shared
with, the C++ reference. Every arithmetic step that the spec pins down is done in float32 exactly
as SPEC §3-4 say (IEEE division, separate multiply and add, fp16 round-to-nearest-even through
numpy's astype(float16)); only the attention of SPEC §8 is float64.

Determinism: all randomness comes from numpy.random.RandomState, whose streams NumPy guarantees
never to change (NEP 19), unlike Generator's. Outputs hold no timestamps or versions, so a rerun
is byte-for-byte identical (tools/regen-golden --check proves it).

Portability: the bytes must not depend on the CPU, the BLAS or the libm that runs this script,
because CI regenerates them on whatever x86-64 machine it gets. So every float64 result is
software-defined: no `@`/dot/sum reductions (BLAS and numpy's SIMD loops pick their summation
order per CPU), only element-wise IEEE operations (the same on every CPU) and exactly rounded
sums (fsum_sd); no libm or numpy SIMD transcendental (exp, log, pow differ by an ulp between
glibc's FMA and non-FMA variants and numpy's AVX-512 kernels): exp_sd, log_sd and pow10_sd round
a 40-digit decimal result, and normal() is RandomState's polar method with log_sd.
tests/golden/test_regen_portable.py regenerates under emulated CPUs and proves the bytes equal.
"""

import argparse
import decimal
import hashlib
import json
import math
import os
import sys
from fractions import Fraction

import numpy as np

F32 = np.float32
F16 = np.float16
BLOCK = 32
Q8_0_BYTES = 34
Q5_1_BYTES = 24
NAN_HALF = 0x7E00
ALIGN = 32

np.seterr(all="ignore")  # overflow to inf and 1/subnormal are part of the cases, not accidents


# --------------------------------------------------------------------------------------------
# Software-defined float64 arithmetic (see "Portability" above)
# --------------------------------------------------------------------------------------------

# 40 digits: far more than a double needs, so the double nearest the decimal result is the
# correctly rounded one except within 1e-40 (relative) of a midpoint, and either way the same
# on every machine (decimal is exact integer arithmetic).
_DEC = decimal.Context(prec=40, rounding=decimal.ROUND_HALF_EVEN, Emin=-999999, Emax=999999)


def exp_sd(x):
    return float(_DEC.exp(decimal.Decimal(float(x))))


_LOG_BITS = 192  # fixed-point fraction bits of log_sd: its error is ~2^-190, far below an ulp
_LN2_FIXED = int(decimal.Context(prec=90).multiply(decimal.Context(prec=90).ln(2), 1 << _LOG_BITS))


def log_sd(x):
    """ln x for a positive finite double, in integer fixed point (decimal's ln is 10x slower):
    x = m·2^e with m in [1/√2, √2), ln m = 2·atanh((m-1)/(m+1)) by its series; Python's int / int
    is correctly rounded, so the result is the double nearest the fixed-point value."""
    m, e = math.frexp(float(x))
    assert m > 0
    if m < 0.7071067811865476:
        m, e = 2.0 * m, e - 1
    one = 1 << 53
    mi = int(m * one)  # exact: m has 53 significant bits
    t = (abs(mi - one) << _LOG_BITS) // (mi + one)  # |t| (the odd series carries the sign)
    t2 = (t * t) >> _LOG_BITS
    total, term, k = 0, t, 1
    while term:
        total += term // k
        term = (term * t2) >> _LOG_BITS
        k += 2
    if mi < one:
        total = -total
    return (2 * total + e * _LN2_FIXED) / (1 << _LOG_BITS)


def pow10_sd(x):
    """10.0 ** x: exact for integral x, else through a 40-digit exp(x·ln 10)."""
    x = float(x)
    if x == int(x):
        return float(Fraction(10) ** int(x))
    return float(_DEC.exp(_DEC.multiply(decimal.Decimal(x), _DEC.ln(decimal.Decimal(10)))))


def fsum_sd(terms):
    """The exactly rounded sum of float64 terms (IEEE special cases as a plain sum has them)."""
    terms = np.asarray(terms, dtype=np.float64)
    if not np.isfinite(terms).all():
        if np.isnan(terms).any() or (np.isposinf(terms).any() and np.isneginf(terms).any()):
            return math.nan
        return math.inf if np.isposinf(terms).any() else -math.inf
    try:
        return math.fsum(terms.tolist())
    except OverflowError:  # the exact sum is beyond float64: IEEE rounding gives +-inf
        return math.copysign(math.inf, float(Fraction(0) + sum(Fraction(t) for t in terms.tolist())))


def row_fsums(m):
    return np.array([fsum_sd(r) for r in m], dtype=np.float64)


def col_fsums(m):
    return row_fsums(np.asarray(m).T)


def normal(rs, loc, scale, size=None):
    """RandomState.normal(loc, scale, size) drawn the way numpy's legacy generator draws it (the
    polar method, one cached second value, loc + scale·g per element), with log_sd in place of
    libm's log, so the values are the same stream on every machine."""
    st = rs.get_state(legacy=True)
    has, cached = bool(st[3]), float(st[4])
    count = 1 if size is None else int(np.prod(size))
    out = np.empty(count, dtype=np.float64)
    for i in range(count):
        if has:
            g, has, cached = cached, False, 0.0
        else:
            while True:
                x1 = 2.0 * float(rs.random_sample()) - 1.0
                x2 = 2.0 * float(rs.random_sample()) - 1.0
                r2 = x1 * x1 + x2 * x2
                if r2 < 1.0 and r2 != 0.0:
                    break
            f = math.sqrt(-2.0 * log_sd(r2) / r2)
            cached, has = f * x1, True
            g = f * x2
        out[i] = float(loc) + float(scale) * g
    st = rs.get_state(legacy=True)
    rs.set_state((st[0], st[1], st[2], int(has), cached))
    return float(out[0]) if size is None else out.reshape(size)


# --------------------------------------------------------------------------------------------
# Scalar helpers
# --------------------------------------------------------------------------------------------

def f32_bits(v):
    return int(np.array([v], dtype=F32).view(np.uint32)[0])


def f32_from_bits(b):
    return np.array([b], dtype=np.uint32).view(F32)[0]


def f32_hex(v):
    return "0x%08x" % f32_bits(v)


def f32_repr(v):
    """Readable value for the manifest; the bits (f32_hex) are what tests compare."""
    v = F32(v)
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def round_to_f32_exact(fr):
    """Fraction -> float32, round to nearest even, exactly (no double rounding)."""
    c = F32(float(fr))
    best = None
    for cand in (np.nextafter(c, F32(-np.inf)), c, np.nextafter(c, F32(np.inf))):
        if not np.isfinite(cand):
            continue
        err = abs(Fraction(float(cand)) - fr)
        key = (err, f32_bits(cand) & 1)  # on a tie, the even significand wins
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


# --------------------------------------------------------------------------------------------
# Quantizers (SPEC §2-3) and dequantizers (SPEC §4), vectorized over blocks
# --------------------------------------------------------------------------------------------

def roundf(v):
    """C roundf on float32: half away from zero, computed exactly (|v| - floor(|v|) is exact)."""
    a = np.abs(v)
    f = np.floor(a)
    r = f + (a - f >= F32(0.5)).astype(F32)
    return np.copysign(r, v).astype(F32)


def safe_reciprocal(d):
    """1/d in f32, or 0 where d == 0 or 1/d is not finite (the degenerate-block rule, SPEC §3)."""
    with np.errstate(all="ignore"):
        inv = (F32(1) / d).astype(F32)
    return np.where((d == 0) | ~np.isfinite(inv), F32(0), inv).astype(F32)


def reported_value(block):
    """The value a bad block is reported with: its first non-finite value, else the first value
    of largest magnitude (matching the reference's bad-block report)."""
    nonfinite = np.nonzero(~np.isfinite(block))[0]
    if nonfinite.size:
        return block[nonfinite[0]]
    return block[int(np.argmax(np.abs(block)))]


def first_extreme(x, which):
    """Per block, the first element equal to the min (or max). ggml's reference keeps the first
    one it sees (strict < / >), which matters only for the sign of a zero extreme; numpy's
    min/max reductions do not promise which zero they return."""
    ext = x.min(axis=1) if which == "min" else x.max(axis=1)
    idx = np.argmax(x == ext[:, None], axis=1)
    return x[np.arange(x.shape[0]), idx]


def quantize_q8_0(x):
    """x: (n, 32) float32 -> (bytes (n, 34) uint8, bad list [(block, value)], degenerate idx)."""
    x = np.ascontiguousarray(x, dtype=F32)
    n = x.shape[0]
    out = np.zeros((n, Q8_0_BYTES), dtype=np.uint8)
    finite = np.isfinite(x).all(axis=1)
    amax = np.abs(x).max(axis=1).astype(F32)
    d = (amax / F32(127)).astype(F32)  # IEEE f32 division
    with np.errstate(all="ignore"):
        d_half = d.astype(F16)  # round to nearest even
    bad = ~finite | np.isinf(d_half)
    with np.errstate(all="ignore"):
        inv = (F32(1) / d).astype(F32)
    degenerate = ~bad & (d != 0) & ~np.isfinite(inv)
    ident = safe_reciprocal(np.where(bad, F32(0), d))
    q = roundf((np.where(bad[:, None], F32(0), x) * ident[:, None]).astype(F32))
    assert np.all(np.abs(q) <= 127), "q8_0 quant out of range"
    out[:, 0:2] = d_half.astype("<f2").view(np.uint8).reshape(n, 2)
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    out[bad] = 0
    out[bad, 0:2] = np.array([NAN_HALF], dtype="<u2").view(np.uint8)
    bad_list = [(int(b), reported_value(x[b])) for b in np.nonzero(bad)[0]]
    return out, bad_list, [int(b) for b in np.nonzero(degenerate)[0]]


def quantize_q5_1(x):
    """x: (n, 32) float32 -> (bytes (n, 24) uint8, bad list [(block, value)], degenerate idx)."""
    x = np.ascontiguousarray(x, dtype=F32)
    n = x.shape[0]
    out = np.zeros((n, Q5_1_BYTES), dtype=np.uint8)
    finite = np.isfinite(x).all(axis=1)
    xs = np.where(finite[:, None], x, F32(0))  # keeps the min/max search away from NaN
    lo = first_extreme(xs, "min").astype(F32)
    hi = first_extreme(xs, "max").astype(F32)
    d = ((hi - lo) / F32(31)).astype(F32)
    with np.errstate(all="ignore"):
        d_half = d.astype(F16)
        m_half = lo.astype(F16)
        inv = (F32(1) / d).astype(F32)
    bad = ~finite | ~np.isfinite(d) | np.isinf(d_half) | np.isinf(m_half)
    degenerate = ~bad & (d != 0) & ~np.isfinite(inv)
    ident = safe_reciprocal(np.where(bad, F32(0), d))
    scaled = ((xs - lo[:, None]) * ident[:, None]).astype(F32)  # one f32 multiply ...
    shifted = (scaled + F32(0.5)).astype(F32)  # ... then one f32 add, never fused
    shifted = np.where(bad[:, None], F32(0), shifted)
    q = np.trunc(shifted).astype(np.int64)
    assert q.min() >= 0 and q.max() <= 31, "q5_1 quant out of range"
    qh = ((q >> 4) & 1) << np.arange(32, dtype=np.int64)[None, :]
    qh = qh.sum(axis=1).astype("<u4")
    qs = ((q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)).astype(np.uint8)
    out[:, 0:2] = d_half.astype("<f2").view(np.uint8).reshape(n, 2)
    out[:, 2:4] = m_half.astype("<f2").view(np.uint8).reshape(n, 2)
    out[:, 4:8] = qh.view(np.uint8).reshape(n, 4)
    out[:, 8:] = qs
    out[bad] = 0
    out[bad, 0:2] = np.array([NAN_HALF], dtype="<u2").view(np.uint8)
    out[bad, 2:4] = np.array([NAN_HALF], dtype="<u2").view(np.uint8)
    bad_list = [(int(b), reported_value(x[b])) for b in np.nonzero(bad)[0]]
    return out, bad_list, [int(b) for b in np.nonzero(degenerate)[0]]


QUANTIZERS = {"q8_0": quantize_q8_0, "q5_1": quantize_q5_1}
BLOCK_BYTES = {"q8_0": Q8_0_BYTES, "q5_1": Q5_1_BYTES}


def dequantize_q8_0(b):
    """b: (n, 34) uint8 -> (n, 32) float32: f32(d)·q."""
    d = np.ascontiguousarray(b[:, 0:2]).view("<f2").astype(F32)
    q = np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(F32)
    return (d * q).astype(F32)


def dequantize_q5_1(b):
    """b: (n, 24) uint8 -> (n, 32) float32: f32(d)·q then + f32(m), two roundings."""
    d = np.ascontiguousarray(b[:, 0:2]).view("<f2").astype(F32)
    m = np.ascontiguousarray(b[:, 2:4]).view("<f2").astype(F32)
    qh = np.ascontiguousarray(b[:, 4:8]).view("<u4").astype(np.int64)
    qs = b[:, 8:].astype(np.int64)
    lanes = np.arange(32)
    nib = np.where(lanes[None, :] < 16, qs[:, lanes % 16] & 0xF, qs[:, lanes % 16] >> 4)
    q = (nib | (((qh >> lanes[None, :]) & 1) << 4)).astype(F32)
    scaled = (d * q).astype(F32)
    return (scaled + m).astype(F32)


# --------------------------------------------------------------------------------------------
# Quantization case inputs
# --------------------------------------------------------------------------------------------

def blocks_uniform(rs):
    parts = [
        rs.uniform(-1, 1, (24, 32)),
        rs.uniform(0, 1, (8, 32)),  # all positive: q5_1 min > 0
        rs.uniform(-1, 0, (8, 32)),  # all negative: q5_1 max < 0
        rs.uniform(-1000, 1000, (8, 32)),
        rs.uniform(5, 5.01, (8, 32)),  # narrow range far from 0: q5_1 min dominates
    ]
    return np.concatenate(parts).astype(F32), "uniform blocks in [-1,1], [0,1], [-1,0], [-1e3,1e3], [5,5.01]"


def blocks_gaussian(rs):
    scales = [1e-4, 1e-3, 1e-2, 1e-1, 1, 1e1, 1e2, 1e3, 1e4]
    parts = [normal(rs, 0, s, (8, 32)) for s in scales]
    parts.append(normal(rs, 3e4, 1e4, (4, 32)).clip(-6e4, 6e4))  # q5_1 min near the fp16 limit
    return np.concatenate(parts).astype(F32), "gaussian blocks, sigma 1e-4 .. 1e4 (8 blocks each)"


def blocks_fp16_values(rs):
    bits = rs.randint(0, 0x7C00, size=(32, 32)).astype(np.uint16)  # finite magnitudes
    sign = (rs.randint(0, 2, size=(32, 32)) << 15).astype(np.uint16)
    vals = (bits | sign).view(F16).astype(F32)
    # Narrow-exponent blocks too, so that quants are not all 0 next to a huge max.
    exp_bits = (rs.randint(12, 18, size=(16, 32)) << 10) | rs.randint(0, 1024, size=(16, 32))
    narrow = (exp_bits.astype(np.uint16) | sign[:16]).view(F16).astype(F32)
    return np.concatenate([vals, narrow]).astype(F32), "fp16-representable values (random bit patterns, and a narrow exponent band)"


def steps_around(x0, count):
    """float32 values x0, x0±1ulp, x0±2ulp, ... (nearest first)."""
    out = [x0]
    up = down = x0
    for _ in range(count):
        up = np.nextafter(up, F32(np.inf))
        down = np.nextafter(down, F32(-np.inf))
        out += [up, down]
    return out


def blocks_ties_q8_0(rs):
    """Lanes where x·id is exactly k+0.5 in f32: roundf must go away from zero."""
    blocks = []
    ties = even_ties = div_sensitive = 0
    while len(blocks) < 24:
        amax = F32(rs.uniform(0.5, 2.0) * pow10_sd(rs.randint(-3, 4)))
        d = F32(amax / F32(127))
        ident = F32(F32(1) / d)
        blk = [amax if rs.randint(2) else -amax]
        tries = 0
        while len(blk) < 32 and tries < 400:
            tries += 1
            k = int(rs.randint(0, 127))
            sign = F32(1) if rs.randint(2) else F32(-1)
            t = F32(k + 0.5)
            for x in steps_around(F32(t * d), 6):
                if abs(x) <= amax and F32(x * ident) == t:
                    x = F32(sign * x)
                    blk.append(x)
                    ties += 1
                    even_ties += k % 2 == 0
                    if roundf(np.array([x / d], F32))[0] != roundf(np.array([x * ident], F32))[0]:
                        div_sensitive += 1
                    break
        if len(blk) == 32:
            perm = rs.permutation(32)
            blocks.append(np.array(blk, dtype=F32)[perm])
    x = np.array(blocks, dtype=F32)
    stats = {"tie_lanes": ties, "tie_lanes_even_k": even_ties,
             "lanes_where_x_over_d_rounds_differently": div_sensitive}
    return x, "q8_0 half-way ties: x*id == k+0.5 exactly in f32 (round half away from zero)", stats


def fused_q5_1_trunc(a, ident):
    """What an FMA-contracted trunc(a*id + 0.5) would give: one rounding of the exact value."""
    fr = Fraction(float(a)) * Fraction(float(ident)) + Fraction(1, 2)
    return int(np.trunc(round_to_f32_exact(fr)))


def fma_lane(lo, hi, d, ident):
    """An x whose (x-min)·id rounds to 0.5 - 2^-25: the separate f32 add then ties to even at
    1.0 (q = 1), while the exact product + 0.5 rounds below 1 (an FMA gives q = 0). Only the
    q = 1 boundary can do this (the product's binade is finer than the sum's only there), and
    the product passes it once as x - min grows, so a block has at most one or two; None if
    this block has none."""
    below = F32(0.5 - 2.0 ** -25)
    for a in steps_around(F32(F32(0.5) * d), 64):  # walk x - min, the quantity the product sees
        x = F32(a + lo)
        a2 = F32(x - lo)
        if lo <= x <= hi and F32(a2 * ident) == below and fused_q5_1_trunc(a2, ident) == 0:
            return x
    return None


def blocks_ties_q5_1(rs):
    """Lanes where (x-min)·id + 0.5 lands exactly on an integer in f32: both exact ties
    ((x-min)·id == k+0.5) and double-rounding lanes (the product is just below k+0.5 and the
    separate f32 add rounds up). Every even block also holds a lane that an FMA-contracted
    quantizer would get wrong."""
    blocks = []
    exact = rounded_up = fma_sensitive = div_sensitive = 0
    while len(blocks) < 24:
        for _attempt in range(500):
            width = F32(rs.uniform(0.1, 8) * pow10_sd(rs.randint(-2, 3)))
            if len(blocks) % 2:
                lo = F32(rs.uniform(-4, 1) * pow10_sd(rs.randint(-2, 3)))
            else:  # min ≈ -d/2: lanes near min + d/2 sit near 0, where x - min is fine-grained
                lo = F32(-rs.uniform(0.3, 0.7) * width / 31)
            hi = F32(lo + width)
            d = F32((hi - lo) / F32(31))
            ident = F32(F32(1) / d)
            lane = fma_lane(lo, hi, d, ident)
            if lane is not None or len(blocks) % 2:
                break
        assert len(blocks) % 2 or lane is not None, "no FMA-sensitive block found"
        blk = [lo, hi] + ([lane] if lane is not None else [])
        tries = 0
        while len(blk) < 32 and tries < 600:
            tries += 1
            # q = 1 hosts most double-rounding lanes (product in [0.25,0.5), sum in [0.5,1)).
            q = 1 if rs.randint(3) == 0 else int(rs.randint(1, 32))
            target = F32(q)
            x0 = F32(lo + F32(F32(q - 0.5) * d))
            for x in steps_around(x0, 40):
                if not (lo <= x <= hi):
                    continue
                a = F32(x - lo)
                prod = F32(a * ident)
                s = F32(prod + F32(0.5))
                if s != target:
                    continue
                kind = "exact" if prod == F32(q - 0.5) else "rounded"
                # keep a mix, but do not let exact ties crowd out the rarer rounded lanes
                if kind == "exact" and rs.randint(4) == 0 and exact > rounded_up + 8:
                    continue
                blk.append(x)
                if kind == "exact":
                    exact += 1
                else:
                    rounded_up += 1
                if int(np.trunc(F32(F32(a / d) + F32(0.5)))) != q:
                    div_sensitive += 1
                break
        if len(blk) == 32:
            blocks.append(np.array(blk, dtype=F32)[rs.permutation(32)])
    x = np.array(blocks, dtype=F32)
    # Count the FMA-sensitive lanes over the finished blocks (targeted and incidental ones).
    for b in x:
        lo, hi = b.min(), b.max()
        d = F32((hi - lo) / F32(31))
        ident = F32(F32(1) / d)
        for v in b:
            a = F32(v - lo)
            if fused_q5_1_trunc(a, ident) != int(np.trunc(F32(F32(a * ident) + F32(0.5)))):
                fma_sensitive += 1
    stats = {"exact_tie_lanes": exact, "rounded_up_lanes": rounded_up,
             "lanes_an_fma_would_change": fma_sensitive,
             "lanes_where_division_by_d_would_change": div_sensitive}
    return x, "q5_1 boundaries: (x-min)*id+0.5 is exactly an integer in f32 (exact ties, double-rounding lanes, lanes an FMA would change)", stats


def blocks_constant(rs):
    rows = [np.zeros(32), np.full(32, 1.0), np.full(32, -3.25), np.full(32, 0.1),
            np.full(32, 65504.0), np.full(32, -65504.0), np.full(32, 1e-3), np.full(32, 123456.0)]
    for _ in range(8):
        rows.append(np.full(32, normal(rs, 0, 10)))
    x = np.array(rows, dtype=F32)
    x = np.concatenate([x, np.zeros((1, 32), F32)])
    return x, "constant blocks (zero, +-, fp16 max, beyond fp16 for q8_0 only) and zero blocks"


def blocks_outlier(rs):
    base = normal(rs, 0, 1, (16, 32)).astype(F32)
    for i in range(16):
        lane = rs.randint(32)
        base[i, lane] = F32(rs.choice([-1, 1]) * pow10_sd(rs.uniform(1, 4)))
    small = normal(rs, 0, 1e-3, (8, 32)).astype(F32)
    small[np.arange(8), rs.randint(0, 32, 8)] = F32(1.0)
    return np.concatenate([base, small]), "one-outlier blocks (|outlier| 10..1e4 over N(0,1); 1.0 over N(0,1e-3))"


def blocks_signed_zero(rs):
    pz, nz = F32(0.0), F32(-0.0)
    rows = []
    rows.append(np.full(32, pz))
    rows.append(np.full(32, nz))
    r = np.full(32, pz); r[0] = nz; rows.append(r)  # first zero is -0: ggml's min keeps it
    r = np.full(32, nz); r[0] = pz; rows.append(r)  # first zero is +0
    r = np.full(32, nz); r[7] = pz; rows.append(r)
    r = rs.uniform(0, 1, 32); r[3] = nz; r[9] = pz; rows.append(r)   # min is -0 (first zero)
    r = rs.uniform(0, 1, 32); r[3] = pz; r[9] = nz; rows.append(r)   # min is +0 (first zero)
    r = rs.uniform(-1, 0, 32); r[5] = nz; r[6] = pz; rows.append(r)  # max is a zero
    r = normal(rs, 0, 1, 32); r[::4] = nz; rows.append(r)
    r = normal(rs, 0, 1, 32); r[1::3] = pz; r[2::3] = nz; rows.append(r)
    return np.array(rows, dtype=F32), "signed zeros: all +0, all -0, mixed, zero as min or max"


def degenerate_threshold(div):
    """Smallest positive f32 amax/range for which 1/(amax/div) is finite (by search)."""
    lo_b, hi_b = 1, f32_bits(F32(1e-30))
    while lo_b < hi_b:
        mid = (lo_b + hi_b) // 2
        v = f32_from_bits(mid)
        if np.isfinite(F32(F32(1) / F32(v / F32(div)))):
            hi_b = mid
        else:
            lo_b = mid + 1
    return f32_from_bits(lo_b)


def blocks_subnormal(rs):
    rows = []
    t8 = degenerate_threshold(127)
    t5 = degenerate_threshold(31)
    for amax in [F32(1.4e-45), F32(1e-40), F32(1e-38), np.nextafter(t8, F32(0)), t8,
                 np.nextafter(t8, F32(1)), F32(1e-36), F32(1e-30), F32(6e-8), F32(3e-5)]:
        r = (rs.uniform(-1, 1, 32) * float(amax)).astype(F32)
        r[rs.randint(32)] = amax
        rows.append(r)
    # q5_1: ranges straddling its own threshold, offset from zero
    for rng in [np.nextafter(t5, F32(0)), t5, np.nextafter(t5, F32(1)), F32(1e-38)]:
        r = (rs.uniform(0, 1, 32) * float(rng)).astype(F32)
        r[0] = F32(0)
        r[1] = rng
        rows.append(r)
    r = np.array([f32_from_bits(int(b)) for b in rs.randint(1, 0x00800000, 32)], dtype=F32)
    rows.append(r)  # every lane a random f32 subnormal
    rows.append((-np.abs(r)).astype(F32))
    x = np.array(rows, dtype=F32)
    what = ("subnormal-range blocks: amax below/at/above %s (q8_0: 1/d stops being finite) and "
            "range around %s (q5_1); all-subnormal lanes" % (f32_repr(t8), f32_repr(t5)))
    return x, what


def blocks_bad(rs):
    rows = []
    qnan = F32(np.nan)
    neg_nan = f32_from_bits(0xFFC00001)
    payload_nan = f32_from_bits(0x7FC12345)
    for v, lane in [(qnan, 0), (qnan, 31), (neg_nan, 5), (payload_nan, 17),
                    (F32(np.inf), 0), (F32(-np.inf), 12), (F32(np.inf), 31)]:
        r = normal(rs, 0, 1, 32).astype(F32)
        r[lane] = v
        rows.append(r)
    r = normal(rs, 0, 1, 32).astype(F32); r[4] = F32(-np.inf); r[9] = qnan; rows.append(r)  # first non-finite wins
    r = normal(rs, 0, 1, 32).astype(F32); r[2] = F32(3e38); r[20] = qnan; rows.append(r)
    r = np.full(32, qnan, dtype=F32); rows.append(r)
    # fp16 overflow of d (q8_0: amax/127 >= 65520 rounds to inf) and its boundary
    for amax in [F32(8321039.0), F32(8321040.0), F32(1e7), F32(3.4e38)]:
        r = rs.uniform(-1, 1, 32).astype(F32) * amax
        r[rs.randint(32)] = -amax if rs.randint(2) else amax
        rows.append(r.astype(F32))
    # q5_1: fp16 overflow of the minimum (|min| >= 65520) with a small range, and its boundary
    for lo in [F32(-65519.0), F32(-65520.0), F32(-70000.0), F32(65520.0), F32(65519.0)]:
        r = (lo + rs.uniform(0, 1, 32).astype(F32)).astype(F32)
        r[0] = lo
        rows.append(r.astype(F32))
    # q5_1: fp16 overflow of d = range/31, and f32 overflow of max-min
    for half in [F32(1.0e6), F32(1.0157e6), F32(1.02e6), F32(3e38)]:
        r = rs.uniform(-1, 1, 32).astype(F32) * half
        r[0], r[1] = -half, half
        rows.append(r.astype(F32))
    x = np.array(rows, dtype=F32)
    return x, ("bad blocks: NaN (quiet, negative, payload), +-Inf, first non-finite reported, "
               "fp16 overflow of d (q8_0 amax 8321039 vs 8321040), of the q5_1 minimum "
               "(-65519 vs -65520), of q5_1 d, and f32 overflow of max-min")


# --------------------------------------------------------------------------------------------
# Decode cases: the layer model of SPEC §5-6 and the attention of SPEC §8
# --------------------------------------------------------------------------------------------

def align_down(a):
    return a - a % ALIGN


class LayerModel:
    """The flat layer and the compacting ring, on byte planes."""

    def __init__(self, g):
        self.g = g
        if g["storage"] == "ring":
            self.rows = min(g["max_ctx"], g["window"] + g["max_append"] + g["rewind_slack"] + ALIGN - 1)
        else:
            self.rows = g["max_ctx"]
        self.kv_dim = g["n_kv_heads"] * g["head_dim"]
        self.kb = self.kv_dim // BLOCK
        self.k_tok = self.kb * Q8_0_BYTES
        self.v_tok = self.kb * Q5_1_BYTES
        self.k_plane = np.zeros(self.rows * self.k_tok, dtype=np.uint8)
        self.v_plane = np.zeros(self.rows * self.v_tok, dtype=np.uint8)
        self.len = 0
        self.base = 0
        self.data_error = None  # (row, plane 0=K 1=V, block, value): lowest key kept

    def ring(self):
        return self.g["storage"] == "ring"

    def append(self, k, v):
        n = k.shape[0]
        g = self.g
        if n == 0 or self.len + n > g["max_ctx"]:
            return False
        if not self.ring() or self.len - self.base + n <= self.rows:
            write = self.len - self.base
        else:
            retain = max(self.base, align_down(max(0, self.len - (g["window"] - 1) - g["rewind_slack"])))
            keep = self.len - retain
            if keep + n > self.rows:
                return False
            src = slice((retain - self.base) * self.k_tok, (self.len - self.base) * self.k_tok)
            self.k_plane[: keep * self.k_tok] = self.k_plane[src].copy()
            src = slice((retain - self.base) * self.v_tok, (self.len - self.base) * self.v_tok)
            self.v_plane[: keep * self.v_tok] = self.v_plane[src].copy()
            self.base = retain
            write = keep
        kq, kbad, _ = quantize_q8_0(k.reshape(-1, BLOCK))
        vq, vbad, _ = quantize_q5_1(v.reshape(-1, BLOCK))
        self.k_plane[write * self.k_tok:(write + n) * self.k_tok] = kq.reshape(-1)
        self.v_plane[write * self.v_tok:(write + n) * self.v_tok] = vq.reshape(-1)
        for plane, bad in ((0, kbad), (1, vbad)):
            for blk, val in bad:
                key = (self.len + blk // self.kb, plane, blk % self.kb, val)
                if self.data_error is None or key[:3] < self.data_error[:3]:
                    self.data_error = key
        self.len += n
        return True

    def can_rewind_to(self, p):
        if p > self.len or p < 0:
            return False
        if not self.ring():
            return True
        return align_down(max(0, p - (self.g["window"] - 1))) >= self.base

    def rewind(self, p):
        if not self.can_rewind_to(p):
            return False
        self.len = p
        return True

    def view(self):
        w = self.g["window"]
        return (0 if w is None else max(0, self.len - w)), self.len

    def dequantized(self, lbegin, lend):
        p0, p1 = lbegin - self.base, lend - self.base
        assert 0 <= p0 <= p1 <= self.rows
        k = dequantize_q8_0(self.k_plane[p0 * self.k_tok:p1 * self.k_tok].reshape(-1, Q8_0_BYTES))
        v = dequantize_q5_1(self.v_plane[p0 * self.v_tok:p1 * self.v_tok].reshape(-1, Q5_1_BYTES))
        return k.reshape(p1 - p0, self.kv_dim), v.reshape(p1 - p0, self.kv_dim)


def attend(model, q, gqa, scale, view=None):
    """SPEC §8 in float64 over the dequantized cache, over model.view() or the logical keys
    view = (begin, end). Returns (out, mag, smax):
    out[h, j] = sum_t p_t V_t[j]; mag[h, j] = sum_t p_t |V_t[j]|; smax[h] = max_t scale·sum|q K|
    (the last two let a test bound summation-order differences)."""
    nq, hd = q.shape
    g = model.g
    lb, le = model.view() if view is None else view
    out = np.zeros((nq, hd))
    mag = np.zeros((nq, hd))
    smax = np.zeros(nq)
    if le == lb:
        return out, mag, smax
    k, v = model.dequantized(lb, le)
    n = le - lb
    k = k.astype(np.float64).reshape(n, g["n_kv_heads"], hd)
    v = v.astype(np.float64).reshape(n, g["n_kv_heads"], hd)
    s64 = float(scale)
    for h in range(nq):
        kv = h // gqa
        qh = q[h].astype(np.float64)
        kh, vh = k[:, kv, :], v[:, kv, :]
        # A product of two f32 values is exact in float64, so each dot is the exactly rounded sum.
        s = s64 * row_fsums(kh * qh)
        e = np.array([exp_sd(x) for x in s - np.max(s)], dtype=np.float64)
        p = e / fsum_sd(e)
        out[h] = col_fsums(p[:, None] * vh)
        mag[h] = col_fsums(p[:, None] * np.abs(vh))
        smax[h] = np.max(abs(s64) * row_fsums(np.abs(kh) * np.abs(qh)))
    return out, mag, smax


DECODE_CASES = [
    # name, what, geometry, gqa, ops, extras
    dict(name="flat_hd64_gqa1", what="flat, no window; stale rows overwritten after a rewind; "
         "refused append past max_ctx; fill to max_ctx; rewind to 0 (empty view)",
         geo=dict(n_kv_heads=2, head_dim=64, max_ctx=64, window=None, storage="flat"), gqa=1,
         ops=[("a", 1), ("a", 17), ("a", 31), ("r", 40), ("a", 9), ("r", 0), ("a", 47), ("a", 18),
              ("a", 17), ("a", 1)]),
    dict(name="flat_hd128_gqa4", what="flat, no window, single-row appends between chunks",
         geo=dict(n_kv_heads=1, head_dim=128, max_ctx=130, window=None, storage="flat"), gqa=4,
         ops=[("a", 64), ("a", 1), ("a", 1), ("a", 1), ("a", 33), ("r", 99), ("a", 30), ("a", 1),
              ("r", 131), ("a", 1)]),
    dict(name="flat_hd256_gqa8", what="flat, no window, head_dim 256, one KV head",
         geo=dict(n_kv_heads=1, head_dim=256, max_ctx=70, window=None, storage="flat"), gqa=8,
         ops=[("a", 1), ("a", 32), ("a", 37)]),
    dict(name="flatwin_hd128_gqa8_w37", what="flat plane with a 37-key window: len window-1, "
         "window, window+1, then past it; explicit scale 0.0625",
         geo=dict(n_kv_heads=1, head_dim=128, max_ctx=128, window=37, storage="flat"), gqa=8,
         ops=[("a", 36), ("a", 1), ("a", 1), ("a", 50), ("r", 60), ("a", 20)], scale=0.0625),
    dict(name="flatwin_hd64_gqa4_w1_f16", what="flat plane, window 1, f16 inputs",
         geo=dict(n_kv_heads=2, head_dim=64, max_ctx=40, window=1, storage="flat"), gqa=4,
         ops=[("a", 1), ("a", 5), ("r", 3), ("a", 1), ("a", 2)], dtype="f16"),
    dict(name="ring_hd64_gqa1", what="ring window 40, max_append 16, slack 5 (rows 92): several "
         "rebases, rewinds exactly at the limit, refused rewinds",
         geo=dict(n_kv_heads=2, head_dim=64, max_ctx=300, window=40, storage="ring",
                  max_append=16, rewind_slack=5), gqa=1,
         ops=[("a", 16)] * 5 + [("a", 16), ("a", 3), ("rl",), ("a", 16), ("rl-1",), ("a", 7),
              ("a", 1), ("a", 16), ("a", 16), ("a", 13), ("rl",), ("a", 16), ("a", 16), ("a", 2),
              ("a", 16), ("a", 16), ("r", 10)]),
    dict(name="ring_hd128_gqa4_odd", what="ring window 47, max_append 29, slack 3 (rows 110): "
         "odd sizes, rebases with overlapping moves, a refused oversized append",
         geo=dict(n_kv_heads=1, head_dim=128, max_ctx=300, window=47, storage="ring",
                  max_append=29, rewind_slack=3), gqa=4,
         ops=[("a", 29), ("a", 29), ("a", 29), ("a", 2), ("a", 29), ("a", 1), ("a", 1), ("rl",),
              ("a", 29), ("a", 29), ("a", 71), ("a", 13), ("a", 29)]),
    dict(name="ring_hd256_gqa8", what="ring window 33, max_append 16, slack 0 (rows 80), head_dim "
         "256; fills max_ctx, then a refused append",
         geo=dict(n_kv_heads=1, head_dim=256, max_ctx=113, window=33, storage="ring",
                  max_append=16, rewind_slack=0), gqa=8,
         ops=[("a", 16)] * 5 + [("a", 1), ("a", 15), ("a", 16), ("a", 1), ("a", 1)]),
    dict(name="ring_rows_eq_max_ctx", what="ring whose rows are clipped to max_ctx 50: never rebases",
         geo=dict(n_kv_heads=1, head_dim=64, max_ctx=50, window=20, storage="ring",
                  max_append=16, rewind_slack=4), gqa=4,
         ops=[("a", 16), ("a", 16), ("a", 10), ("rl",), ("a", 16), ("a", 8), ("a", 1)]),
    dict(name="ring_w1", what="ring window 1, max_append 2, slack 1 (rows 35): many small appends",
         geo=dict(n_kv_heads=1, head_dim=64, max_ctx=90, window=1, storage="ring",
                  max_append=2, rewind_slack=1), gqa=1,
         ops=[("a", 2), ("a", 1)] * 14 + [("rl",), ("a", 2)] + [("a", 2), ("a", 1)] * 6),
    dict(name="bad_flat", what="flat: NaN in K, +Inf in V and an fp16-overflowing K block give NaN "
         "outputs; rewinding past them and re-appending gives finite outputs; the data error "
         "sticks with the lowest (row, plane, block)",
         geo=dict(n_kv_heads=2, head_dim=64, max_ctx=64, window=None, storage="flat"), gqa=4,
         ops=[("a", 10), ("a", 3, [(1, "k", 70, "nan"), (2, "v", 10, "inf")]),
              ("a", 5, [(0, "k", 3, "1e7")]), ("r", 11), ("a", 4)]),
    dict(name="bad_ring", what="ring: a NaN K row and an fp16-overflowing V minimum are moved by "
         "a rebase (still canonical) and leave the window",
         geo=dict(n_kv_heads=2, head_dim=128, max_ctx=100, window=16, storage="ring",
                  max_append=8, rewind_slack=4), gqa=1,
         ops=[("a", 8)] * 5 + [("a", 8, [(3, "k", 200, "nan"), (5, "v", 40, "-7e4")])] +
             [("a", 8)] * 6 + [("a", 1)]),
]


def decode_inputs(rs, n, kv_dim, n_kv, hd):
    """K rows with per-head scales (so scores are spread), V rows with per-head offsets (so the
    q5_1 minimum matters), and a few outliers."""
    kscale = rs.uniform(0.5, 2.5, n_kv).repeat(hd)
    voff = rs.uniform(-2, 2, n_kv).repeat(hd)
    k = normal(rs, 0, 1, (n, kv_dim)) * kscale[None, :]
    v = normal(rs, 0, 1, (n, kv_dim)) + voff[None, :]
    if n:
        k[rs.randint(0, n, 3), rs.randint(0, kv_dim, 3)] *= 8
        v[rs.randint(0, n, 3), rs.randint(0, kv_dim, 3)] *= 8
    return k.astype(F32), v.astype(F32)


def build_decode_case(spec, seed):
    rs = np.random.RandomState(seed)
    g = dict(max_append=1, rewind_slack=0)
    g.update(spec["geo"])
    gqa = spec["gqa"]
    hd = g["head_dim"]
    nq = g["n_kv_heads"] * gqa
    model = LayerModel(g)
    dtype = spec.get("dtype", "f32")
    if "scale" in spec:
        scale = F32(spec["scale"])
    else:
        scale = F32(F32(1) / np.sqrt(F32(hd)))
    q = normal(rs, 0, 1, (nq, hd)).astype(F32)
    if dtype == "f16":
        q = q.astype(F16).astype(F32)
    k_all, v_all, ops_out, outs, mags, smaxs = [], [], [], [], [], []
    src = 0
    for op in spec["ops"]:
        rec = {}
        if op[0] == "a":
            n = op[1]
            k, v = decode_inputs(rs, n, model.kv_dim, g["n_kv_heads"], hd)
            if dtype == "f16":
                k, v = k.astype(F16).astype(F32), v.astype(F16).astype(F32)
            for row, plane, elem, val in (op[2] if len(op) > 2 else []):
                (k if plane == "k" else v)[row, elem] = F32(float(val))
            ok = model.append(k, v)
            k_all.append(k)
            v_all.append(v)
            rec = {"op": "append", "n": n, "src_row": src}
            src += n
        else:
            if op[0] == "r":
                p = op[1]
            else:  # rewind to the lowest position the ring still allows (minus 1: refused)
                p = model.len
                while p > 0 and model.can_rewind_to(p - 1):
                    p -= 1
                if op[0] == "rl-1":
                    p -= 1
            ok = model.rewind(p)
            rec = {"op": "rewind", "to": p}
        rec.update({"expect": "ok" if ok else "refused", "len": model.len, "base": model.base})
        lb, _ = model.view()
        assert model.len - model.base <= model.rows and model.base % ALIGN == 0
        # SPEC §6 rewinds may reach one row deeper than the window needs (the next append makes
        # the view resident again); a decode in that state is refused (SPEC §9: view outside the
        # resident rows), and its output slot is left all-zero.
        resident = lb >= model.base
        rec["decode"] = "ok" if resident else "refused"
        ops_out.append(rec)
        if resident:
            o, m, s = attend(model, q, gqa, scale)
        else:
            o, m, s = np.zeros((nq, hd)), np.zeros((nq, hd)), np.zeros(nq)
        outs.append(o)
        mags.append(m)
        smaxs.append(s)
    kv_dim = model.kv_dim
    k_all = np.concatenate(k_all) if k_all else np.zeros((0, kv_dim), F32)
    v_all = np.concatenate(v_all) if v_all else np.zeros((0, kv_dim), F32)
    if dtype == "f16":
        k_all, v_all = k_all.astype(F16), v_all.astype(F16)
    return dict(geometry=g, gqa=gqa, n_q_heads=nq, scale=scale, scale_default="scale" not in spec,
                dtype=dtype, q=q, k=k_all, v=v_all, ops=ops_out, out=np.array(outs),
                mag=np.array(mags), smax=np.array(smaxs), model=model)


# --------------------------------------------------------------------------------------------
# Verify cases: speculative steps of SPEC §11 on the same layer model
# --------------------------------------------------------------------------------------------

# Ops: ("a", n) host append; ("r", p) rewind; ("rl",) rewind to the lowest position the ring
# allows; ("v", T, a) one speculative step: reserve(T), T draft rows by a multi-row
# device-counter append, inc_seqlen(T), a verify decode of T queries at L = len + T,
# account_steps(T), then rewind(L - T + a) to keep a drafts; ("d", T) a host-len verify decode
# of T queries at the current state (refused when len < T or the first view is not resident).
VERIFY_CASES = [
    dict(name="verify_flat_hd64_gqa2", what="flat, no window: T 1, 2, 7, 16 with prefixes "
         "kept and drafts rejected (their stale bytes stay in the final planes)",
         geo=dict(n_kv_heads=1, head_dim=64, max_ctx=64, window=None, storage="flat"), gqa=2,
         ops=[("a", 20), ("v", 1, 1), ("v", 2, 1), ("v", 7, 3), ("v", 16, 16), ("v", 16, 5)]),
    dict(name="verify_flatwin_hd128_w5", what="flat plane, window 5, explicit scale 0.125: "
         "the drafts outnumber the window, so every row has its own window; a verify of more "
         "rows than len is refused",
         geo=dict(n_kv_heads=1, head_dim=128, max_ctx=48, window=5, storage="flat"), gqa=1,
         ops=[("a", 3), ("v", 7, 2), ("v", 16, 9), ("v", 2, 0), ("v", 1, 1), ("d", 16),
              ("d", 7)], scale=0.125),
    dict(name="verify_ring_hd64_gqa2_w12", what="ring window 12, max_append 16, slack 15 "
         "(rows 74): verify steps across two rebases, a rewind to the limit (a verify there is "
         "refused), then steps from it",
         geo=dict(n_kv_heads=1, head_dim=64, max_ctx=400, window=12, storage="ring",
                  max_append=16, rewind_slack=15), gqa=2,
         ops=[("a", 16)] * 4 + [("v", 16, 4), ("v", 7, 7), ("a", 16), ("v", 16, 16),
                                ("v", 16, 16), ("v", 2, 1), ("rl",), ("d", 1), ("v", 1, 0),
                                ("v", 7, 3)]),
]


def verify_views(model, length, t):
    """SPEC §11: query row i sits at p_i = length - t + i and attends [s_i, p_i + 1), with
    s_i = max(0, p_i + 1 - window) on a windowed layer, else 0."""
    w = model.g["window"]
    views = []
    for i in range(t):
        end = length - t + i + 1
        views.append((0 if w is None else max(0, end - w), end))
    return views


def build_verify_case(spec, seed):
    rs = np.random.RandomState(seed)
    g = dict(max_append=1, rewind_slack=0)
    g.update(spec["geo"])
    gqa = spec["gqa"]
    hd = g["head_dim"]
    nq = g["n_kv_heads"] * gqa
    model = LayerModel(g)
    scale = F32(spec["scale"]) if "scale" in spec else F32(F32(1) / np.sqrt(F32(hd)))
    k_all, v_all, q_all, outs, mags, smaxs, ops_out = [], [], [], [], [], [], []
    src = q_row = out_row = 0

    def verify_here(t):
        """Draws T queries and attends each over its view at the current len; the op record,
        with decode "refused" when len < T or the first view is not resident."""
        nonlocal q_row, out_row
        q = normal(rs, 0, 1, (t, nq, hd)).astype(F32)
        q_all.append(q)
        rec = {"T": t, "q_row": q_row}
        q_row += t
        views = verify_views(model, model.len, t)
        if model.len < t or views[0][0] < model.base:
            rec["decode"] = "refused"
            return rec
        for i, view in enumerate(views):
            o, m, sm = attend(model, q[i], gqa, scale, view=view)
            outs.append(o)
            mags.append(m)
            smaxs.append(sm)
        rec.update({"decode": "ok", "out_row": out_row})
        out_row += t
        return rec

    for op in spec["ops"]:
        if op[0] in ("a", "v"):
            n = op[1]
            k, v = decode_inputs(rs, n, model.kv_dim, g["n_kv_heads"], hd)
            k_all.append(k)
            v_all.append(v)
            # A speculative step's reserve(T), multi-row device-counter append and
            # account_steps(T) leave the bytes and state of a host append of the T rows (SPEC §7,
            # §11).
            ok = model.append(k, v)
            assert ok, (spec["name"], op)
            rec = {"op": "append" if op[0] == "a" else "verify", "n" if op[0] == "a" else "T": n,
                   "src_row": src}
            src += n
            if op[0] == "v":
                length = model.len
                rec.update(verify_here(n))
                assert rec["decode"] == "ok", (spec["name"], op)
                rec.update({"L": length, "accept": op[2]})
                assert model.rewind(length - n + op[2]), (spec["name"], op)
        elif op[0] == "d":
            rec = {"op": "decode_rows"}
            rec.update(verify_here(op[1]))
        else:
            if op[0] == "r":
                p = op[1]
            else:
                p = model.len
                while p > 0 and model.can_rewind_to(p - 1):
                    p -= 1
            assert model.rewind(p), (spec["name"], op)
            rec = {"op": "rewind", "to": p}
        assert model.len - model.base <= model.rows and model.base % ALIGN == 0
        rec.update({"len": model.len, "base": model.base})
        ops_out.append(rec)
    return dict(geometry=g, gqa=gqa, n_q_heads=nq, scale=scale, scale_default="scale" not in spec,
                q=np.concatenate(q_all), k=np.concatenate(k_all), v=np.concatenate(v_all),
                ops=ops_out, out=np.array(outs).reshape(-1, nq, hd),
                mag=np.array(mags).reshape(-1, nq, hd), smax=np.array(smaxs).reshape(-1, nq),
                model=model)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

def round_up_f32(a):
    """float64 -> float32 never below the input (NaN stays NaN): magnitudes only enter an
    error bound, where rounding up keeps it a bound and halves the bytes."""
    r = a.astype(F32)
    low = r.astype(np.float64) < a
    r[low] = np.nextafter(r[low], F32(np.inf))
    return r


class Writer:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.files = {}

    def _record(self, rel, data, shape, dtype, seed):
        self.files[rel] = {"shape": list(shape), "dtype": dtype, "seed": seed,
                           "sha256": hashlib.sha256(data).hexdigest()}

    def npy(self, rel, arr, seed):
        path = os.path.join(self.out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        arr = np.ascontiguousarray(arr)
        np.save(path, arr, allow_pickle=False)
        with open(path, "rb") as f:
            data = f.read()
        self._record(rel, data, arr.shape, arr.dtype.name, seed)
        return rel

    def bin(self, rel, arr, seed):
        path = os.path.join(self.out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
        with open(path, "wb") as f:
            f.write(data)
        self._record(rel, data, [len(data)], "uint8", seed)
        return rel


def geometry_entry(g, rows):
    """A decode or verify case's geometry as the manifest records it."""
    return {"n_kv_heads": g["n_kv_heads"], "head_dim": g["head_dim"], "max_ctx": g["max_ctx"],
            "window": g["window"], "storage": g["storage"], "max_append": g["max_append"],
            "rewind_slack": g["rewind_slack"], "rows": rows}


def scale_entries(r):
    """The softmax scale: its f32 bits, its repr, and whether it was the layer's default."""
    return {"scale_bits": f32_hex(r["scale"]), "scale": f32_repr(r["scale"]),
            "scale_is_default": r["scale_default"]}


def final_entry(w, pre, m, seed):
    """The model's state after a case's operations; writes its planes with `w`."""
    return {"len": m.len, "base": m.base,
            "k_plane": w.bin(pre + ".kplane.bin", m.k_plane, seed),
            "v_plane": w.bin(pre + ".vplane.bin", m.v_plane, seed)}


QUANT_SETS = [
    ("uniform", blocks_uniform),
    ("gaussian", blocks_gaussian),
    ("fp16_values", blocks_fp16_values),
    ("ties_q8_0", blocks_ties_q8_0),
    ("ties_q5_1", blocks_ties_q5_1),
    ("constant", blocks_constant),
    ("outlier", blocks_outlier),
    ("signed_zero", blocks_signed_zero),
    ("subnormal", blocks_subnormal),
    ("bad", blocks_bad),
]


def generate(out_dir):
    w = Writer(out_dir)
    cases = []
    for i, (name, fn) in enumerate(QUANT_SETS):
        seed = 1000 + i
        res = fn(np.random.RandomState(seed))
        x, what = res[0], res[1]
        stats = res[2] if len(res) > 2 else {}
        assert x.dtype == F32 and x.ndim == 2 and x.shape[1] == BLOCK
        case = {"name": name, "kind": "quant", "what": what, "seed": seed, "blocks": int(x.shape[0]),
                "input": w.npy("quant/%s.input.npy" % name, x, seed), "formats": {}}
        for fmt, quant in QUANTIZERS.items():
            b, bad, degenerate = quant(x)
            case["formats"][fmt] = {
                "expected": w.bin("quant/%s.%s.bin" % (name, fmt), b, seed),
                "bad_blocks": [{"block": blk, "value_bits": f32_hex(v), "value": f32_repr(v)}
                               for blk, v in bad],
                "degenerate_blocks": degenerate,
            }
        if stats:
            case["stats"] = stats
        cases.append(case)

    for i, spec in enumerate(DECODE_CASES):
        seed = 2000 + i
        r = build_decode_case(spec, seed)
        name = spec["name"]
        g = r["geometry"]
        m = r["model"]
        pre = "decode/%s" % name
        case = {
            "name": name, "kind": "decode", "what": spec["what"], "seed": seed,
            "geometry": geometry_entry(g, m.rows),
            "gqa": r["gqa"], "n_q_heads": r["n_q_heads"], "input_dtype": r["dtype"],
            **scale_entries(r),
            "k_input": w.npy(pre + ".k.npy", r["k"], seed),
            "v_input": w.npy(pre + ".v.npy", r["v"], seed),
            "query": w.npy(pre + ".q.npy", r["q"], seed),
            "ops": r["ops"],
            "outputs": w.npy(pre + ".out.npy", r["out"], seed),
            "magnitudes": w.npy(pre + ".mag.npy", round_up_f32(r["mag"]), seed),
            "score_magnitudes": w.npy(pre + ".smax.npy", round_up_f32(r["smax"]), seed),
            "final": final_entry(w, pre, m, seed),
            "data_error": None if m.data_error is None else {
                "row": m.data_error[0], "plane": "KV"[m.data_error[1]], "block": m.data_error[2],
                "value_bits": f32_hex(m.data_error[3]), "value": f32_repr(m.data_error[3])},
        }
        cases.append(case)

    # The verify cases list their files apart, so that "files" stays exactly what "cases" use.
    wv = Writer(out_dir)
    verify_cases = []
    for i, spec in enumerate(VERIFY_CASES):
        seed = 3000 + i
        r = build_verify_case(spec, seed)
        name = spec["name"]
        g = r["geometry"]
        m = r["model"]
        pre = "verify/%s" % name
        verify_cases.append({
            "name": name, "kind": "verify", "what": spec["what"], "seed": seed,
            "geometry": geometry_entry(g, m.rows),
            "gqa": r["gqa"], "n_q_heads": r["n_q_heads"], "input_dtype": "f32",
            **scale_entries(r),
            "k_input": wv.npy(pre + ".k.npy", r["k"], seed),
            "v_input": wv.npy(pre + ".v.npy", r["v"], seed),
            "queries": wv.npy(pre + ".q.npy", r["q"], seed),
            "ops": r["ops"],
            "outputs": wv.npy(pre + ".out.npy", r["out"], seed),
            "magnitudes": wv.npy(pre + ".mag.npy", round_up_f32(r["mag"]), seed),
            "score_magnitudes": wv.npy(pre + ".smax.npy", round_up_f32(r["smax"]), seed),
            "final": final_entry(wv, pre, m, seed),
        })

    manifest = {
        "format": "kvlayer-golden-1",
        "generator": "golden/generate.py",
        "spec": "SPEC.md sections 2-8",
        "notes": ["outputs[i] / magnitudes[i] / score_magnitudes[i] hold the decode state after ops[i]",
                  "value_bits are IEEE f32 bits; value is informative only"],
        "files": dict(sorted(w.files.items())),
        "cases": cases,
        "verify": {
            "spec": "SPEC.md section 11",
            "notes": ["ops: append (host), rewind, verify (reserve(T), a T-row device-counter "
                      "append, inc_seqlen(T), a verify decode at L, account_steps(T), "
                      "rewind(L - T + accept)), decode_rows (a host-len verify decode)",
                      "queries rows [q_row, q_row + T) are an op's T query rows; outputs, "
                      "magnitudes and score_magnitudes rows [out_row, out_row + T) its T "
                      "output rows (row i: query i over [s_i, p_i + 1)); a refused decode has "
                      "no out_row",
                      "len and base are the state after the op (after the accepting rewind)"],
            "files": dict(sorted(wv.files.items())),
            "cases": verify_cases,
        },
    }
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="ascii") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "data"), help="output directory")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    m = generate(args.out)
    files = list(m["files"]) + list(m["verify"]["files"])
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in files)
    kinds = {}
    for c in m["cases"] + m["verify"]["cases"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    print("golden: %d files, %d bytes, cases %s -> %s" % (len(files), total, kinds, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
