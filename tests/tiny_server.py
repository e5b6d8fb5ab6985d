"""A real `tacit serve` on a tiny checkpoint, for the bench tests that load a server over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tacit.bench.launch import free_port, stop_process, wait_healthy

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def tiny_server(model_dir: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """(the server's URL, the environment to run `python -m tacit.cli` against it with)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tacit.cli", "serve", "--model", str(model_dir), "--dtype", "float32"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_healthy(url, proc, 120, lambda: "")
        yield url, env
    finally:
        stop_process(proc)
