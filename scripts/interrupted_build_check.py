"""Kill a real kernel build part-way, then build again: the second build must start at once (no
wait on the dead build's lock) and finish in a normal build's time. Runs in a fresh cache
directory (TACIT_CACHE_DIR), so the kernels tacit uses are not touched.

    python scripts/interrupted_build_check.py [--kill-after 5,30,80]

For each --kill-after S: `tacit build-kernels` is started, its whole process group killed
(SIGKILL, as a closed terminal or an OOM kill would) S seconds in, and `tacit build-kernels` run
again; the line printed gives the second build's wall time and whether it printed a wait. A first
uninterrupted build gives the normal time to compare with.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time


def build(env: dict, kill_after: float | None = None) -> tuple[float, str]:
    """(wall seconds, stderr) of `tacit build-kernels`, killed after kill_after seconds if given."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tacit.cli", "build-kernels"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return time.perf_counter() - t0, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kill-after", default="5,30,80", help="seconds into the build to kill it, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tacit-build-check-") as cache:
        env = dict(os.environ, TACIT_CACHE_DIR=cache)
        normal, _ = build(env)
        print(f"uninterrupted build: {normal:.0f} s", flush=True)
        for s in [float(x) for x in args.kill_after.split(",")]:
            with tempfile.TemporaryDirectory(prefix="tacit-build-check-") as fresh:
                env = dict(os.environ, TACIT_CACHE_DIR=fresh)
                build(env, kill_after=s)
                again, err = build(env)
                waited = "waited on a lock" if "waiting for" in err else "no wait"
                print(f"killed after {s:.0f} s: the next build took {again:.0f} s ({waited})", flush=True)


if __name__ == "__main__":
    main()
