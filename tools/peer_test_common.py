"""The scaffolding that tools/test_verify_peers.py and tools/test_batch_peers.py share: the
optional numpy and torch, skips, silenced output, usage errors, a run on a fake runner,
peers.py, and the runner that prints the closing 'N passed, 0 failed' line."""
import importlib
import json
import os
import sys
import tempfile

from peer_common import find_peers_dir, import_peers


class Skip(Exception):
    pass


def optional(name):
    """The module, or None where it is not installed (the tests that need it skip)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def quiet(f, *args, **kw):
    saved = sys.stdout
    sys.stdout = open(os.devnull, "w")
    try:
        return f(*args, **kw)
    finally:
        sys.stdout.close()
        sys.stdout = saved


def assert_usage_error(parse_args, argv):
    """parse_args(argv) exits with argparse's status 2 (its message silenced)."""
    saved = sys.stderr
    sys.stderr = open(os.devnull, "w")
    try:
        parse_args(argv)
    except SystemExit as e:
        assert e.code == 2, argv
    else:
        raise AssertionError(f"{argv} was accepted")
    finally:
        sys.stderr.close()
        sys.stderr = saved


def run_main(main, runner_class, extra, **fake):
    """main(['--json', FILE] + extra) on one runner_class(a, **fake), its output silenced:
    (exit status, the JSON, the runner)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        made = []

        def factory(a):
            made.append(runner_class(a, **fake))
            return made[0]
        rc = quiet(main, ["--json", out] + extra, runner_factory=factory)
        with open(out) as f:
            return rc, json.load(f), made[0]


def peers_or_skip():
    """(peers.py as a module, its folder); Skip where no peers.py is beside the checkout."""
    d = find_peers_dir()
    if d is None:
        raise Skip("no peers.py beside the checkout (.peers or ../shared/peers)")
    return import_peers(), d


def run_tests(tests):
    """Each test in turn: a failure raises (exit status 1), a Skip is counted and said."""
    passed = skipped = 0
    for t in tests:
        try:
            t()
            passed += 1
        except Skip as e:
            skipped += 1
            print(f"{t.__name__}: skipped ({e})")
    print(f"{passed} passed, 0 failed" + (f", {skipped} skipped" if skipped else ""))
