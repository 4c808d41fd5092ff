"""The GPU suite in one device call: first the tests that must have the GPU
alone (scripts/gpu_alone.py says which), one at a time; then the others
side by side, a file to a worker (pytest-xdist with --dist loadfile, so a
file's tests keep their order and its module-level state).

    python3 scripts/gpu_pytest.py [--workers 4] [--out DIR] [--timeout 120]
                                  [-k EXPR] [PATH or test id ...]

Writes DIR/pytest-alone.log and DIR/pytest-shared.log (pytest -v -rsP, as
one run would print), prints each run's closing line, and exits non-zero
when either run failed. Without pytest-xdist, or with --workers 1, the
shared tests also run one at a time. A worker holds a few GiB of managed
memory at most, and each starts its allocator with a cap below the free
memory it sees, so workers never oversubscribe the card between them.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_alone import measures_device_memory  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collect(paths, keyword):
    """The test ids pytest collects from `paths`, or raises with its output."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", *paths]
    if keyword:
        cmd += ["-k", keyword]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode not in (0, 5):
        raise SystemExit(f"collection failed (pytest exit {r.returncode}):\n{r.stdout[-4000:]}"
                         f"{r.stderr[-2000:]}")
    return [line.strip() for line in r.stdout.splitlines() if "::" in line]


def split(ids, root=ROOT):
    """(alone, shared): the ids that must have the GPU alone, and the rest."""
    cache = {}
    alone = [t for t in ids if measures_device_memory(t, root, cache)]
    chosen = set(alone)
    return alone, [t for t in ids if t not in chosen]


def has_xdist():
    try:
        import xdist  # noqa: F401
        return True
    except ImportError:
        return False


def closing_line(log):
    """pytest's last '=== ... in N s ===' line, or the log's last line."""
    lines = [line for line in log.splitlines() if line.strip()]
    found = [line for line in lines if re.match(r"^=+ .* in [\d.]+s", line)]
    return (found or lines or ["(no output)"])[-1]


def run(name, ids, out, timeout, workers):
    """Runs pytest over `ids` (an args file: the command line stays short);
    returns its exit status, 0 when there was nothing to run."""
    if not ids:
        print(f"{name}: no tests")
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write("\n".join(ids) + "\n")
        args_file = f.name
    cmd = [sys.executable, "-m", "pytest", "-v", "-rsP", "--timeout", str(timeout)]
    if workers > 1:
        cmd += ["-p", "xdist", "-n", str(workers), "--dist", "loadfile"]
    cmd.append("@" + args_file)
    t0 = time.time()
    log_path = os.path.join(out, f"{name}.log")
    with open(log_path, "w") as log:
        # a group of its own: a time limit's TERM here ends pytest's workers too
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"{name}: stopped after {time.time() - t0:.0f} s; its log: {log_path}")
            raise
        finally:
            os.unlink(args_file)
    with open(log_path) as log:
        last = closing_line(log.read())
    print(f"{name}: {len(ids)} tests, {workers} at a time, exit {rc}, {time.time() - t0:.0f} s: {last}")
    return 0 if rc == 5 else rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=["tests/python"])
    ap.add_argument("-k", dest="keyword", default=None, help="pytest's -k, for both runs")
    ap.add_argument("--workers", type=int, default=4, help="shared tests at a time (default 4)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds a test (pytest-timeout)")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "gpu_logs")))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    alone, shared = split(collect(args.paths, args.keyword))
    workers = args.workers if has_xdist() else 1
    if workers != args.workers:
        print("pytest-xdist is not installed: the shared tests run one at a time")
    rc_alone = run("pytest-alone", alone, args.out, args.timeout, 1)
    rc_shared = run("pytest-shared", shared, args.out, args.timeout, workers)
    return 1 if rc_alone or rc_shared else 0


def _stop(signum, _frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    sys.exit(main())
