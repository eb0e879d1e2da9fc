#!/usr/bin/env python3
"""Sums the coverage tables of parallel `kvlayer fuzz` processes and checks the floors (SPEC
§10.7): every instance named on a "coverage selectable:" line ran 1, 2 and >= 3 key-loop trips
per warp, and the merges over 256 splits, verifies of T > 16, ring views past base over >= 2
splits and rebases of >= 2 units each happened at least once, and so did batch decodes of >= 2
sequences, batch decodes of ring sequences at different bases and batch graph replays after a
membership change (SPEC §12).

usage: campaign_coverage.py LOG...   (exit 1 when a floor is unmet or no log has a table)
"""
import re
import sys

ROW = re.compile(r"^  (\S+ d\d+ r\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$")
EXTRA = re.compile(r"verify T > 16: (\d+); ring views past base over >= 2 splits: (\d+); "
                   r"rebases of >= 2 units: (\d+)")
BATCH = re.compile(r"batch decodes of >= 2 sequences: (\d+); of ring sequences at different "
                   r"bases: (\d+); graph replays after a membership change: (\d+)")


def parse(paths):
    instances, extra, selectable, tables = {}, [0] * 6, set(), 0
    for path in paths:
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError as e:
            print(f"campaign_coverage: {path}: {e}", file=sys.stderr)
            continue
        for line in text.splitlines():
            if line.startswith("coverage: "):
                tables += 1
            m = ROW.match(line)
            if m:
                counts = [int(x) for x in m.groups()[1:]]
                old = instances.get(m.group(1), [0] * 5)
                instances[m.group(1)] = [a + b for a, b in zip(old, counts)]
            m = EXTRA.search(line)
            if m:
                extra[:3] = [a + int(b) for a, b in zip(extra[:3], m.groups())]
            m = BATCH.search(line)
            if m:
                extra[3:] = [a + int(b) for a, b in zip(extra[3:], m.groups())]
            if line.startswith("coverage selectable:"):
                selectable.update(x.strip() for x in line.split(":", 1)[1].split(";") if x.strip())
    return instances, extra, selectable, tables


def unmet(instances, extra, selectable):
    out = []
    for name in sorted(selectable):
        row = instances.get(name, [0] * 5)
        for i, bucket in enumerate(["1 trip", "2 trips", ">= 3 trips"]):
            if row[1 + i] == 0:
                out.append(f"{name}: no launch of {bucket}")
    if sum(r[4] for r in instances.values()) == 0:
        out.append("no merge over more than 256 splits")
    for count, what in zip(extra, ["no verify of T > 16", "no ring view past base over >= 2 splits",
                                   "no rebase of >= 2 units", "no batch decode of >= 2 sequences",
                                   "no batch decode of ring sequences at different bases",
                                   "no batch graph replay after a membership change"]):
        if count == 0:
            out.append(what)
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    instances, extra, selectable, tables = parse(argv[1:])
    print(f"coverage over {tables} process(es): launches per kernel instance by the longest warp "
          "loop's trips")
    print(f"  {'instance':28} {'launches':>10} {'1 trip':>10} {'2 trips':>10} {'>= 3 trips':>10} "
          f"{'> 256 splits':>12}")
    for name in sorted(set(instances) | selectable):
        r = instances.get(name, [0] * 5)
        print(f"  {name:28} {r[0]:10} {r[1]:10} {r[2]:10} {r[3]:10} {r[4]:12}")
    print(f"  verify T > 16: {extra[0]}; ring views past base over >= 2 splits: {extra[1]}; "
          f"rebases of >= 2 units: {extra[2]}")
    print(f"  batch decodes of >= 2 sequences: {extra[3]}; of ring sequences at different bases: "
          f"{extra[4]}; graph replays after a membership change: {extra[5]}")
    if tables == 0:
        print("coverage: FAIL (no process printed a coverage table)")
        return 1
    missing = unmet(instances, extra, selectable)
    for m in missing:
        print(f"coverage floor not met: {m}")
    print(f"coverage: {'PASS' if not missing else 'FAIL'} ({len(selectable)} selectable instances, "
          f"{len(missing)} floors unmet)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
