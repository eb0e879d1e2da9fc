"""The committed golden data (golden/data, written by golden/generate.py) read for the Python
tests: the decode and verify cases replayed on kvlayer.reference.KvLayer exactly as
tests/golden replays them on the C++ reference."""

import json
import math

import numpy as np

from conftest import GOLDEN

MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())


def quant_cases():
    return [c for c in MANIFEST["cases"] if c["kind"] == "quant"]


def decode_cases():
    return [c for c in MANIFEST["cases"] if c["kind"] == "decode"]


def verify_cases():
    return MANIFEST["verify"]["cases"]


def npy(rel):
    return np.load(GOLDEN / rel)


def raw(rel):
    return np.fromfile(GOLDEN / rel, dtype=np.uint8)


def scale_of(case):
    """None for the default scale, else the case's f32 scale from its bits."""
    if case["scale_is_default"]:
        return None
    return float(np.array([int(case["scale_bits"], 16)], dtype=np.uint32).view(np.float32)[0])


def layer_of(case):
    import kvlayer.reference as kref

    g = case["geometry"]
    return kref.KvLayer(g["n_kv_heads"], g["head_dim"], g["max_ctx"], case["n_q_heads"],
                        window=g["window"], storage=g["storage"], max_append=g["max_append"],
                        rewind_slack=g["rewind_slack"], max_verify=64)


def decode_tolerance(magnitude, score_magnitude, head_dim, n_keys):
    """golden/loader's decode_tolerance: the bound on |reference - golden|, two float64
    evaluations of the same attention that differ only in rounding order (check.hpp derives
    it)."""
    u = 2.0 ** -53
    delta = (2.0 * (head_dim + 1) + 4.0) * u * score_magnitude
    eps_w = math.expm1(delta) + 16.0 * u
    return 2.0 * (2.0 * eps_w + (4.0 * n_keys + 4.0) * u) * magnitude


def within(got, want, magnitudes, score_magnitudes, head_dim, n_keys):
    """Element-wise |got - want| <= tolerance for one decode output (n_q_heads, head_dim);
    NaN must meet NaN (a bad block in the view). Returns the failing elements' description."""
    failures = []
    for h in range(want.shape[0]):
        for e in range(want.shape[1]):
            w, g = want[h, e], got[h, e]
            if math.isnan(w):
                if not math.isnan(g):
                    failures.append(f"head {h} elem {e}: {g}, golden NaN")
                continue
            tol = decode_tolerance(float(magnitudes[h, e]), float(score_magnitudes[h]), head_dim,
                                   n_keys)
            if not abs(g - w) <= tol:
                failures.append(f"head {h} elem {e}: {g} vs golden {w}, |err| {abs(g - w)} > {tol}")
    return failures
