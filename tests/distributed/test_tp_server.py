"""`tacit serve --tensor-parallel-size 2`: answers as one process does; when its worker dies,
requests get 503 and the server exits non-zero within seconds instead of hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tacit import LLM, SamplingParams  # noqa: E402
from tacit.bench.launch import free_port, stop_process, wait_healthy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def worker_pids(pid: int) -> list[int]:
    """The server's tensor-parallel workers: its spawned children other than the resource tracker."""
    # Children are listed under the thread that started them (the engine thread).
    children = [c for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    out = []
    for c in children:
        cmdline = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            out.append(int(c))
    return out


@pytest.mark.parametrize("extra", [[], ["--data-parallel-attention"]])
def test_tp2_server_answers_then_exits_when_its_worker_dies(tiny_llama, extra):
    """Also under data-parallel attention, where the one request lives on rank 0 and the killed
    worker (rank 1) had none: it still joined every step's collectives."""
    _, _, path = tiny_llama
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "tacit.cli", "serve", "--model", str(path), "--port", str(port)]
    cmd += ["--dtype", "float32", "--tensor-parallel-size", "2", *extra]
    proc = subprocess.Popen(
        cmd,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
    try:
        wait_healthy(url, proc, 120, lambda: "".join(log))
        prompt = [5, 17, 33, 80, 120]
        body = {"model": "x", "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json={**body, "model": str(path)}, timeout=60)
        assert r.status_code == 200, r.text
        want = LLM(str(path), dtype="float32").generate(
            [prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        )
        assert r.json()["choices"][0]["text"] == want[0].outputs[0].text

        (worker,) = worker_pids(proc.pid)
        os.kill(worker, signal.SIGKILL)
        start = time.monotonic()
        r = httpx.post(f"{url}/v1/completions", json={**body, "model": str(path)}, timeout=30)
        assert r.status_code == 503, r.text
        assert "rank 1" in r.json()["error"]["message"]
        assert proc.wait(timeout=20) == 1
        assert time.monotonic() - start < 20
        assert "tensor-parallel worker rank 1" in "".join(log)
    finally:
        if proc.poll() is None:
            stop_process(proc)
