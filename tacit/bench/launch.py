"""Start a server subprocess on a free loopback port (`tacit serve`, or llama.cpp's server as a
peer), wait until it answers, stop it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {name: value}, model_name label dropped, other labels kept in the name."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        extra = [x for x in labels.rstrip("}").split(",") if x and not x.startswith("model_name=")]
        out[f"{name}{{{','.join(extra)}}}" if extra else name] = float(value)
    return out


def wait_healthy(
    url: str, proc: subprocess.Popen, timeout_s: float, output: Callable[[], str], path: str = "/health"
) -> None:
    """Return once GET `path` answers 200; RuntimeError (with the server's output) if the
    process exits first or timeout_s passes."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{output()}")
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not healthy after {timeout_s:.0f} s:\n{output()}")


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM (the server drains and exits 0), SIGKILL if it has not gone in timeout_s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class ServerProcess:
    """An OpenAI-compatible server in its own process: command(port) starts it; ready once GET
    health_path answers 200."""

    def __init__(self, command: Callable[[int], list[str]], health_path: str, ready_timeout_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty server never blocks
        self.proc = subprocess.Popen(
            command(self.port), stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ)
        )
        try:
            wait_healthy(self.url, self.proc, ready_timeout_s, self.output, health_path)
        except RuntimeError:
            self.stop()
            raise

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def metrics(self) -> dict[str, float]:
        import httpx

        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=10).text)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class TacitServer(ServerProcess):
    def __init__(self, args: list[str], ready_timeout_s: float = 300.0) -> None:
        super().__init__(
            lambda port: [sys.executable, "-m", "tacit.cli", "serve", "--port", str(port), *args],
            "/health",
            ready_timeout_s,
        )


class LlamaCppServer(ServerProcess):
    """llama-cpp-python's server (`python -m llama_cpp.server`, the bench extra with its [server]
    deps) on a GGUF, with its prompt cache in RAM (`--cache true --cache_type ram`), on as many
    threads as this process may use. python: the interpreter that has it installed."""

    def __init__(self, gguf: str, n_ctx: int, python: str = sys.executable, ready_timeout_s: float = 300.0) -> None:
        threads = str(len(os.sched_getaffinity(0)))
        super().__init__(
            lambda port: [
                python,
                "-m",
                "llama_cpp.server",
                "--model",
                gguf,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                str(n_ctx),
                "--n_threads",
                threads,
                "--n_threads_batch",
                threads,
                "--cache",
                "true",
                "--cache_type",
                "ram",
            ],  # fmt: skip
            "/v1/models",
            ready_timeout_s,
        )
