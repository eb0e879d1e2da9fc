"""What tools/verify_peers.py and tools/batch_peers.py share, so that the two peer harnesses
read their options, name their peers, check outputs, find peers.py, survive a failing call and
keep their JSON alike: both import it from their own folder (run as scripts or by path)."""
import json
import os
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_run_args(ap):
    """The options of peers.py's Timer (it reads min_calls, replays, warmup), the budget and
    --allow-jit."""
    ap.add_argument("--min-calls", type=int, default=16, help="min calls per captured graph")
    ap.add_argument("--replays", type=int, default=30, help="timed graph replays per row")
    ap.add_argument("--warmup", type=int, default=3, help="untimed graph replays")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="start no new measurement after this many seconds")
    ap.add_argument("--allow-jit", action="store_true",
                    help="let FlashInfer JIT-compile what is not prebuilt (default: such peers "
                         "fail with the reason)")


def parse_peers(ap, a, default, known):
    """The peers of --peers ('all': `default`) less --skip; an unknown name is a usage error."""
    if a.peers == "all":
        peers = list(default)
    else:
        peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    skip = {p.strip() for p in a.skip.split(",") if p.strip()}
    peers = [p for p in peers if p not in skip]
    bad = [p for p in peers if p not in known]
    if bad:
        ap.error(f"unknown peers {bad}; known: {known}")
    return peers


def peer_impl(peer):
    return peer.rsplit("_", 1)[0]


def peer_kv(peer):
    return peer.rsplit("_", 1)[1]


def within(err, ref_max):
    """peers.py's check: max abs error within 10% of the reference's max abs (+ 1e-3)."""
    return err <= 0.1 * ref_max + 1e-3


def short(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:240] if text else ''}"


# ---------------------------------------------------------------------------------------
# the run


class Sticky(Exception):
    """A CUDA error that outlives its call: the run stops (the JSON so far is kept)."""


def guarded(runner, rows, label, target, f, row=None):
    """target.update(f()); an exception becomes target['error'] and is returned (None when f
    ran). One that leaves the device in an error state (runner.synchronize() fails after it)
    ends the run (Sticky), with `row` (the row it was for) appended to rows."""
    try:
        target.update(f())
        return None
    except Exception as e:
        target["error"] = short(e)
        print(f"  [{label}] ERROR {target['error']}", flush=True)
        print("    " + "\n    ".join(traceback.format_exc().strip().splitlines()[-4:]),
              flush=True)
        try:
            runner.synchronize()
        except Exception as e2:
            target["error"] += f" | sticky: {short(e2)}"
            if row is not None:
                row["error"] = target["error"]
                rows.append(row)
            raise Sticky(target["error"]) from e2
        return e


def cuda_torch(name):
    """torch, where it imports and sees a CUDA device (else None, said under the script's
    name), with fp32 matmuls kept fp32 for the references."""
    try:
        import torch
    except ImportError as e:
        print(f"{name}: {e}: nothing to measure", flush=True)
        return None
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device visible; nothing to measure", flush=True)
        return None
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference stays fp32
    return torch


def json_args(a):
    """The parsed options that are plain JSON values, for the result's 'args'."""
    return {k: v for k, v in vars(a).items()
            if isinstance(v, (int, float, str, list, bool)) or v is None}


def write_json(path, result):
    """result into `path` (None: nowhere) through a temporary file: a run cut off mid-write
    leaves the last whole JSON."""
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, path)


def run_saved(name, run, result, dump, t0):
    """run() to its end or to a Sticky error (rc 2, the reason in result['stopped']); then the
    total time into result and the JSON written. Returns the exit status."""
    rc = 0
    try:
        run()
    except Sticky as e:
        print(f"{name}: stopped on a sticky CUDA error: {e}", flush=True)
        result["stopped"] = str(e)
        rc = 2
    result["total_s"] = round(time.time() - t0, 1)
    dump()
    return rc


# ---------------------------------------------------------------------------------------
# peers.py


def find_peers_dir(explicit=None):
    cands = [explicit] if explicit else [os.environ.get("KVLAYER_PEERS_DIR"),
                                         os.path.join(REPO, ".peers"),
                                         os.path.join(REPO, "..", "shared", "peers")]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "peers.py")):
            return os.path.abspath(c)
    return None


def import_peers(explicit=None):
    """peers.py as a module (its Timer, env_info and the builders the scripts use), from the
    first folder that has it."""
    d = find_peers_dir(explicit)
    if d is None:
        raise ImportError("peers.py not found (--peers-dir, $KVLAYER_PEERS_DIR, .peers or "
                          "../shared/peers)")
    if d not in sys.path:
        sys.path.insert(0, d)
    import peers  # noqa: E402
    return peers
