#!/usr/bin/env python3
"""The golden data does not depend on the CPU that generates it.

Regenerates golden/data under several emulated CPUs in one run and proves every file
byte-identical to the committed data. Each emulation takes away what made the bytes
CPU-dependent before generate.py became software-defined:
  - OpenBLAS core types (OPENBLAS_CORETYPE): BLAS picks its kernels, so its summation order,
    per core;
  - glibc's ifuncs (GLIBC_TUNABLES hwcaps): libm's exp/log/pow have FMA and non-FMA variants;
  - numpy's dispatch (NPY_DISABLE_CPU_FEATURES): every SIMD target above the baseline
    (AVX2/FMA, AVX-512 kernels of exp and the reductions) switched off.
The table says, for each run, which OpenBLAS core and numpy targets it really ran with, so an
emulation that did not take effect is visible. Exit 1 on any difference.
"""

import concurrent.futures
import filecmp
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
GENERATOR = os.path.join(HERE, "generate.py")

PROBE = r"""
import ctypes, glob, os, numpy
from numpy._core import _multiarray_umath as m
core = "?"
for lib in glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs", "*openblas*")):
    for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
        f = getattr(ctypes.CDLL(lib), name, None)
        if f is not None:
            f.restype = ctypes.c_char_p
            core = f().decode()
            break
on = [t for t in m.__cpu_dispatch__ if m.__cpu_features__.get(t)]
print(core, ",".join(on) or "baseline-only")
"""


def dispatch_targets():
    """numpy's SIMD dispatch targets this CPU has (disabling one it lacks is an error)."""
    out = subprocess.run([sys.executable, "-c",
                          "from numpy._core import _multiarray_umath as m;"
                          "print(' '.join(t for t in m.__cpu_dispatch__ if m.__cpu_features__.get(t)))"],
                         check=True, capture_output=True, text=True).stdout.split()
    return out


def emulations():
    targets = " ".join(dispatch_targets())
    runs = [
        ("native", {}),
        ("OpenBLAS Prescott", {"OPENBLAS_CORETYPE": "Prescott"}),
        ("OpenBLAS Sandybridge", {"OPENBLAS_CORETYPE": "Sandybridge"}),
        ("OpenBLAS Haswell", {"OPENBLAS_CORETYPE": "Haswell"}),
        ("glibc without AVX2/FMA", {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2_Usable,-FMA_Usable,-AVX2,-FMA"}),
    ]
    if targets:
        runs.append(("numpy baseline only", {"NPY_DISABLE_CPU_FEATURES": targets}))
        runs.append(("all of the above", {"OPENBLAS_CORETYPE": "Prescott",
                                          "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2_Usable,-FMA_Usable,-AVX2,-FMA",
                                          "NPY_DISABLE_CPU_FEATURES": targets}))
    return runs


def differing(out_dir):
    bad = []
    for root, _, files in os.walk(out_dir):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), out_dir)
            ref = os.path.join(DATA, rel)
            if not os.path.isfile(ref):
                bad.append("not in golden/data: " + rel)
            elif not filecmp.cmp(os.path.join(root, f), ref, shallow=False):
                bad.append("differs: " + rel)
    for root, _, files in os.walk(DATA):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), DATA)
            if not os.path.isfile(os.path.join(out_dir, rel)):
                bad.append("not produced: " + rel)
    return sorted(bad)


def run(name, env_delta, tmp):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **env_delta)
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    seen = probe.stdout.strip() if probe.returncode == 0 else "probe failed: " + probe.stderr.strip()[-200:]
    out_dir = os.path.join(tmp, name.replace(" ", "_").replace("/", "_"))
    gen = subprocess.run([sys.executable, GENERATOR, "--out", out_dir], env=env,
                         capture_output=True, text=True)
    if gen.returncode != 0:
        return name, seen, ["generator failed: " + gen.stderr.strip()[-400:]]
    return name, seen, differing(out_dir)


def main():
    if not os.path.isdir(DATA):
        print("test_regen_portable: %s does not exist" % DATA, file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(lambda e: run(e[0], e[1], tmp), emulations()))
    failed = 0
    print("%-24s %-44s %s" % ("emulation", "OpenBLAS core, numpy targets on", "result"))
    for name, seen, bad in results:
        print("%-24s %-44s %s" % (name, seen, "identical" if not bad else "%d file(s) differ" % len(bad)))
        for b in bad[:20]:
            print("    " + b)
        failed += bool(bad)
    if failed:
        print("test_regen_portable: FAIL, %d of %d emulations differ from golden/data" % (failed, len(results)))
        return 1
    print("test_regen_portable: PASS, %d emulations byte-identical to golden/data" % len(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
