#!/usr/bin/env python3
"""CPU checks of tools/bench-ab (no GPU, standard library only): the bench-output parser, and a
whole --unpack run over fake builds (shell scripts printing `kvlayer bench` lines) whose rows,
medians, ratios and spreads are checked, the round-robin order included; a --variant run (a
packed build under an environment variable); the refusals.

    python3 tools/test_bench_ab.py        (exit 0: all passed)
"""
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "bench-ab")
sys.path.insert(0, HERE)
from tool_module import load_tool  # noqa: E402

ab = load_tool("bench-ab")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def bench_text(dc1k, dcw, verify_t2):
    """`kvlayer bench` lines as it prints them (the fields bench-ab reads), with a ceiling row,
    an eager row and a header that must be ignored."""
    return "\n".join([
        "kvlayer bench on NVIDIA H200 (132 SMs, L2 60 MiB), 50 reps, medians",
        "kernel        geometry / shape   keys window   µs   bytes   GB/s % ceiling floor µs  % floor",
        "stream_read   2 GiB   0  -   477.02   2147483648   4502  100.0%   476.45   99.9%",
        f"decode_dc     8x128 gqa 8   1024  -   {dc1k + 4:.2f}   1966080   127  2.8%  7.78  50.1%",
        f"decode_dc_graph 8x128 gqa 8   1024  -   {dc1k:.2f}   1966080   179  4.0%  7.78  70.7%",
        f"decode_dcw_graph 1x128 gqa 16  131072  4096  {dcw:.2f}  1  1  1%  1  1%",
        f"verify_dc_graph T2 8x128 gqa 8   4096  -   {verify_t2:.2f}   7733248  433  9.6%  9.18  51.4%",
    ]) + "\n"


def fake_build(tmp, name, script):
    """A packed build: the shell script `script` as the binary `name`, alone in NAME.tar.xz."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + script)
    os.chmod(path, 0o755)
    archive = os.path.join(tmp, f"{name}.tar.xz")
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(path, arcname=name)
    return archive


# ---- the parser ----
r = ab.rows(bench_text(10.5, 12.25, 17.75))
check(len(r) == 3, f"rows: 3 graph rows expected, got {sorted(r)}")
check(r.get(("decode_dc_graph", "", "8x128", "8", "1024", "-")) == 10.5, "rows: decode 1K")
check(r.get(("decode_dcw_graph", "", "1x128", "16", "131072", "4096")) == 12.25, "rows: window")
check(r.get(("verify_dc_graph", "T2", "8x128", "8", "4096", "-")) == 17.75, "rows: verify T2")
batch = ab.rows("batch_dc      8x128 gqa 8 B 32 log     214215      -     130.00   1  1  1%  1  1%\n"
                "batch_dc_graph 8x128 gqa 8 B 32 log     214215      -     120.50   1  1  1%  1  1%\n")
check(batch == {("batch_dc_graph", "B32 log", "8x128", "8", "214215", "-"): 120.5},
      f"rows: the graph-replayed batch row alone, got {batch}")
verify = ab.rows("batch_verify_dc_graph T4 8x128 gqa 8 B 8 4k   32768   -   90.25   1  1  1%  1  1%\n")
check(verify == {("batch_verify_dc_graph", "T4 B8 4k", "8x128", "8", "32768", "-"): 90.25},
      f"rows: a batch verify row keeps its T, got {verify}")
# `kvlayer bench --decode-only` lines (the window column reads "keys"), decode and verify alike
only = ab.rows("decode_dc_graph  8x64 gqa 8    16384 keys      18.62 us      511 GB/s\n"
               "verify_dc_graph T8 8x64 gqa 8    16384 keys      66.06 us      234 GB/s\n")
check(only == {("decode_dc_graph", "", "8x64", "8", "16384", "keys"): 18.62,
               ("verify_dc_graph", "T8", "8x64", "8", "16384", "keys"): 66.06},
      f"rows: --decode-only lines, got {only}")

# ---- a whole run over fake builds ----
with tempfile.TemporaryDirectory() as tmp:
    order = os.path.join(tmp, "order")
    # Build "old" prints 10.0 then 12.0 (rounds 1, 2); "new" 9.0 then 9.5; each appends its name.
    for name, values in (("old", (10.0, 12.0)), ("new", (9.0, 9.5))):
        outs = [bench_text(v, 2 * v, 3 * v) for v in values]
        for i, text in enumerate(outs):
            with open(os.path.join(tmp, f"{name}.{i}"), "w") as f:
                f.write(text)
        with open(os.path.join(tmp, name), "w") as f:
            f.write("#!/bin/sh\n"
                    f"n=$(cat {order} 2>/dev/null | grep -c {name})\n"
                    f"echo {name} >> {order}\n"
                    f"case \"$*\" in *--no-verify*) ;; *) echo missing --no-verify >&2; exit 3;; esac\n"
                    f"cat {tmp}/{name}.$n\n")
        os.chmod(os.path.join(tmp, name), 0o755)
    archive = os.path.join(tmp, "ab.tar.xz")
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(os.path.join(tmp, "old"), arcname="old")
        tar.add(os.path.join(tmp, "new"), arcname="new")
    keep = os.path.join(tmp, "runs")
    p = subprocess.run([sys.executable, SCRIPT, "--unpack", archive, "--out", keep],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"run: exit {p.returncode}: {p.stderr}")
    lines = p.stdout.strip().splitlines()
    check(lines and lines[0].split(" | ")[5:] == ["old", "spread", "new", "new/old", "spread"],
          f"run: header {lines[:1]}")
    dc = [l for l in lines if l.startswith("decode_dc |")]
    check(len(dc) == 1 and dc[0].split(" | ")[5:] == ["11.00", "2.00", "9.25", "0.841", "0.50"],
          f"run: decode row medians, ratio, spreads: {dc}")
    with open(order) as f:
        check(f.read().split() == ["old", "new", "old", "new"], "run: rounds alternate builds")
    check(sorted(os.listdir(keep)) == ["new-1.txt", "new-2.txt", "old-1.txt", "old-2.txt"],
          "run: --out keeps every run's output")

    # A variant runs a packed build under extra environment variables, in the round-robin.
    envy = fake_build(tmp, "envy", f"echo envy-$AB_KNOB >> {order}\n"
                      f"case \"$AB_KNOB\" in on) cat {tmp}/new.0;; *) cat {tmp}/old.0;; esac\n")
    os.remove(order)
    p = subprocess.run([sys.executable, SCRIPT, "--unpack", envy, "--rounds", "1",
                        "--variant", "knob=envy:AB_KNOB=on"], capture_output=True, text=True)
    lines = p.stdout.strip().splitlines()
    dc = [l for l in lines if l.startswith("decode_dc |")]
    check(p.returncode == 0 and len(dc) == 1
          and dc[0].split(" | ")[5:] == ["10.00", "0.00", "9.00", "0.900", "0.00"],
          f"variant: {p.returncode} {p.stderr!r} {dc}")
    with open(order) as f:
        check(f.read().split() == ["envy-", "envy-on"], "variant: runs the build with its variable")
    p = subprocess.run([sys.executable, SCRIPT, "--unpack", envy, "--variant", "knob=other:X=1"],
                       capture_output=True, text=True)
    check(p.returncode != 0 and "'knob=other:X=1' is not NAME=BUILD:VAR=VALUE" in p.stderr,
          f"variant of no packed build: {p.returncode} {p.stderr!r}")

    # --bench-args reach every run, after bench's own arguments.
    argy = fake_build(tmp, "argy", f"echo \"$*\" >> {order}\ncat {tmp}/old.0\n")
    os.remove(order)
    p = subprocess.run([sys.executable, SCRIPT, "--unpack", argy, "--rounds", "1",
                        "--bench-args", "--decode-only 16384 --shape 8x64x8"],
                       capture_output=True, text=True)
    with open(order) as f:
        got = f.read().strip()
    check(p.returncode == 0 and
          got == "bench --no-accuracy --no-verify --decode-only 16384 --shape 8x64x8",
          f"bench-args: {p.returncode} {p.stderr!r} {got!r}")

    # A build that fails names itself and its round.
    bad = fake_build(tmp, "bad", "echo no CUDA device >&2\nexit 1\n")
    p = subprocess.run([sys.executable, SCRIPT, "--unpack", bad], capture_output=True, text=True)
    check(p.returncode != 0 and "bad round 1 exited 1" in p.stderr and "no CUDA device" in p.stderr,
          f"failing build: {p.returncode} {p.stderr!r}")

# ---- refusals ----
p = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
check(p.returncode == 2 and "give --pack DEST NAME=PATH" in p.stderr, f"no mode: {p.stderr!r}")
p = subprocess.run([sys.executable, SCRIPT, "--pack", "/tmp/x.tar.xz", "no-equals"],
                   capture_output=True, text=True)
check(p.returncode != 0 and "'no-equals' is not NAME=PATH" in p.stderr, f"bad spec: {p.stderr!r}")

if failures:
    for f in failures:
        print("FAIL:", f)
    sys.exit(1)
print("test_bench_ab: all checks passed")
