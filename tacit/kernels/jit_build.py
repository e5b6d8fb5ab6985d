"""Compile a directory's C++ once, on first use, into tacit's cache, keyed by a hash of the
sources and flags: the CPU kernels (kernels/cpu_kernels.py) and the shared-memory communicator
(distributed/shm_kernels.py) both load this way.

A build must survive being killed at any moment (Ctrl-C during a first `tacit chat`, a timeout,
a closed terminal). torch's own `load` keeps a lock file in the build directory that a killed
build leaves behind, and every later load then waited on it forever at 0% CPU; it also re-runs
ninja on each load, which rebuilt a cached module whenever a fresh checkout gave the sources
newer times. So here:

- a finished module is one file, `<name>.so`, that only ever appears by a rename once complete:
  if it is there it is loaded directly, no compiler, no lock;
- a build holds an flock on `build.lock` (the kernel releases it when its holder dies, however it
  dies), so two processes never compile the same module at once and a dead one never blocks the
  next; a process that waits says for whom;
- the build runs in a private directory under the module's, renamed into place when linked, and
  leftovers of killed builds are removed by the next builder.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

import torch

LOCK_FILE = "build.lock"
PRIVATE_PREFIX = "building-"
PROGRESS_EVERY_S = 15.0  # a line on stderr this often while compiling, so a wait is never silent


def source_hash(csrc: Path, flags: list[str]) -> str:
    """12 hex digits of sha256 over every .cpp and .h in csrc (headers included) and the flags."""
    h = hashlib.sha256(" ".join(flags).encode())
    for f in sorted(csrc.iterdir()):
        if f.suffix in (".cpp", ".h"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def module_dir(prefix: str, csrc: Path, hashed_flags: list[str]) -> tuple[str, Path]:
    """(module name, its directory in the cache): one of each per source version and torch."""
    from tacit.paths import cache_dir

    name = f"{prefix}_{source_hash(csrc, hashed_flags)}"
    return name, cache_dir() / "kernels" / f"torch-{torch.__version__}" / name


def _import(name: str, so: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@contextmanager
def _build_lock(path: Path, what: str) -> Iterator[None]:
    """Exclusive flock on path; while another live process holds it, say so and wait."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            print(f"tacit: waiting for {holder} to finish {what} ({path})", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def _progress(build: Path, total: int, what: str) -> Iterator[None]:
    """A line every PROGRESS_EVERY_S: seconds so far and how many sources have an object file."""
    done = threading.Event()
    start = time.monotonic()

    def report() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            objects = len(list(build.glob("*.o")))
            print(
                f"tacit: {what}: {objects}/{total} sources compiled, {time.monotonic() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def build_extension(
    prefix: str,
    csrc: Path,
    sources: list[str],
    cflags: list[str],
    ldflags: list[str],
    hashed_flags: list[str],
    compiling: str,
    unavailable: str,
) -> ModuleType | None:
    """The module built from csrc/sources, or None after printing why (no compiler, no ninja, an
    odd toolchain: the caller keeps its torch fallback). compiling: what a first build is called
    in the messages; unavailable: how a failure is announced."""
    name, home = module_dir(prefix, csrc, hashed_flags)
    so = home / f"{name}.so"
    if so.exists():
        try:
            return _import(name, so)
        except ImportError as e:  # a .so an older tacit linked in place and a kill cut short
            print(f"tacit: cached {so} does not load ({e}); rebuilding", file=sys.stderr, flush=True)
    try:
        home.mkdir(parents=True, exist_ok=True)
        with _build_lock(home / LOCK_FILE, compiling):
            return _build_locked(name, home, so, csrc, sources, cflags, ldflags, compiling)
    except Exception as e:
        print(f"tacit: {unavailable} ({type(e).__name__}: {str(e)[:300]})", file=sys.stderr)
        return None


def _build_locked(
    name: str,
    home: Path,
    so: Path,
    csrc: Path,
    sources: list[str],
    cflags: list[str],
    ldflags: list[str],
    compiling: str,
) -> ModuleType:
    from torch.utils.cpp_extension import load

    if so.exists():  # built by the process this one waited for
        try:
            return _import(name, so)
        except ImportError:
            so.unlink()
    for leftover in home.iterdir():  # killed builds' private directories: nobody else builds here now
        if leftover.is_dir() and leftover.name.startswith(PRIVATE_PREFIX):
            shutil.rmtree(leftover, ignore_errors=True)
    if shutil.which("ninja") is None:  # pip's ninja lives beside this interpreter, maybe not on PATH
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    private = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=home))
    print(f"tacit: {compiling} ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        with _progress(private, len(sources), compiling):
            module = load(
                name=name,
                sources=[str(csrc / s) for s in sources],
                build_directory=str(private),
                extra_include_paths=[str(csrc)],
                extra_cflags=cflags,
                extra_ldflags=ldflags,
                verbose=False,
            )
        os.replace(private / f"{name}.so", so)  # the loaded library stays mapped across the rename
        module.__file__ = str(so)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    print(f"tacit: {compiling}: done in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return module
