"""pytest plumbing of the kvlayer Python tests (python/tests).

--skip-exit-code N: exit with status N when every test skipped and none failed, so that ctest
(SKIP_RETURN_CODE) reports a GPU suite run without a GPU as Skipped rather than Passed.
"""

import os
from pathlib import Path

import pytest

import kvlayer

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden" / "data"


def pytest_addoption(parser):
    parser.addoption("--skip-exit-code", type=int, default=None,
                     help="exit status when every test was skipped (ctest's SKIP_RETURN_CODE)")


def pytest_report_header(config):
    reason = kvlayer.cuda_unavailable_reason()
    return [f"kvlayer {kvlayer.__version__} from {Path(kvlayer.__file__).parent}",
            f"kvlayer CUDA layer: {'available' if reason is None else 'unavailable: ' + reason}"]


def pytest_sessionfinish(session, exitstatus):
    code = session.config.getoption("--skip-exit-code")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    # pytest exits 5 (no tests collected) when a module skips itself whole.
    if code is None or reporter is None or exitstatus not in (0, 5):
        return
    stats = reporter.stats
    if stats.get("skipped") and not stats.get("passed") and not stats.get("failed"):
        session.exitstatus = code


def require_gguf():
    """gguf-py, or a skip; KVLAYER_REQUIRE_GGUF=1 (set by ctest: tools/bootstrap installs it)
    makes its absence a failure instead."""
    if os.environ.get("KVLAYER_REQUIRE_GGUF") == "1":
        import gguf  # noqa: F401  (an ImportError fails the test)
        import gguf.quants
        return gguf
    return pytest.importorskip("gguf")


def refusal(f, *args, **kwargs):
    """The message of the kvlayer.Error (kind 'refused') that f(*args) raises."""
    with pytest.raises(kvlayer.Error) as info:
        f(*args, **kwargs)
    assert isinstance(info.value, RuntimeError)
    assert info.value.kind == "refused", str(info.value)
    return str(info.value)
