#!/usr/bin/env python3
"""CPU checks of tools/campaign_coverage.py: two fake `kvlayer fuzz` logs whose coverage tables
sum to every floor met (exit 0), and the same with one trip bucket and one extra row missing
(exit 1, each unmet floor named); no table at all fails.

    python3 tools/test_campaign_coverage.py        (exit 0: all passed)
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "campaign_coverage.py")
failures = []


def log(rows, extra, selectable):
    lines = ["kvlayer fuzz summary", "coverage: launches per kernel instance by the longest warp "
             "loop's trips", f"  {'instance':28} {'launches':>10} {'1 trip':>10} {'2 trips':>10} "
             f"{'>= 3 trips':>10} {'> 256 splits':>12}"]
    for name, c in rows.items():
        lines.append(f"  {name:28} {c[0]:10} {c[1]:10} {c[2]:10} {c[3]:10} {c[4]:12}")
    lines.append(f"  verify T > 16: {extra[0]}; ring views past base over >= 2 splits: {extra[1]}; "
                 f"rebases of >= 2 units: {extra[2]}")
    lines.append(f"  batch decodes of >= 2 sequences: {extra[3]}; of ring sequences at different "
                 f"bases: {extra[4]}; graph replays after a membership change: {extra[5]}")
    lines.append("coverage selectable: " + "; ".join(selectable))
    return "\n".join(lines) + "\n"


def run(texts):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, t in enumerate(texts):
            p = os.path.join(d, f"fuzz-{i}.log")
            with open(p, "w") as f:
                f.write(t)
            paths.append(p)
        r = subprocess.run([sys.executable, SCRIPT, *paths], capture_output=True, text=True)
        return r.returncode, r.stdout


sel = ["mma_direct d128 r8", "mma_verify d256 r32"]
a = log({"mma_direct d128 r8": [5, 2, 0, 3, 0]}, [1, 0, 0, 4, 0, 1], sel)
b = log({"mma_direct d128 r8": [4, 0, 1, 3, 2], "mma_verify d256 r32": [3, 1, 1, 1, 0]},
        [0, 2, 1, 0, 3, 0], sel)
rc, out = run([a, b])
if rc != 0 or "coverage: PASS" not in out:
    failures.append(f"summed floors met: rc {rc}\n{out}")
if "mma_direct d128 r8                    9          2          1          6            2" \
        not in out:
    failures.append(f"summed row wrong:\n{out}")
b_missing = log({"mma_direct d128 r8": [4, 0, 1, 3, 2], "mma_verify d256 r32": [3, 1, 0, 1, 0]},
                [0, 0, 1, 0, 0, 0], sel)
rc, out = run([a, b_missing])
if rc != 1 or "mma_verify d256 r32: no launch of 2 trips" not in out or \
        "no ring view past base over >= 2 splits" not in out or \
        "no batch decode of ring sequences at different bases" not in out:
    failures.append(f"unmet floors not named: rc {rc}\n{out}")
rc, out = run(["kvlayer fuzz summary\n"])
if rc != 1 or "no process printed a coverage table" not in out:
    failures.append(f"no table: rc {rc}\n{out}")

for f in failures:
    print("FAIL:", f)
print("test_campaign_coverage:", "FAIL" if failures else "PASS")
sys.exit(1 if failures else 0)
