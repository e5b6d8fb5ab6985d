"""What can be served from this machine without downloading (`tacit models`): the default model,
tacit's own cache (GGUF files, the random:NAME checkpoints the benchmarks write) and the Hugging
Face cache's model repos, each with the name --model takes and its size on disk."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from tacit.loader.default_model import default_model_path
from tacit.loader.hf_cache import cached_models, hf_hub_cache
from tacit.paths import cache_dir


@dataclass(frozen=True)
class LocalModel:
    model: str  # what --model (or LLM(model=...)) takes
    format: str  # "gguf" or "safetensors"
    size_bytes: int
    source: str  # "default", "tacit cache" or "huggingface cache"
    path: str
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _size(path: Path) -> int:
    """Bytes on disk of a file, or of a folder's files (symlinks followed: the HF cache's are)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tacit_cache_models() -> list[LocalModel]:
    """The default model and the .gguf files and checkpoint folders (config.json) in cache_dir()."""
    root, default = cache_dir(), default_model_path()
    found = []
    if default.is_file():
        found.append(LocalModel(str(default), "gguf", _size(default), "default", str(default), "used when no --model"))
    if not root.is_dir():
        return found
    for path in sorted(root.iterdir()):
        if path == default:
            continue
        if path.suffix == ".gguf" and path.is_file():
            found.append(LocalModel(str(path), "gguf", _size(path), "tacit cache", str(path)))
        elif (path / "config.json").is_file() and any(path.glob("*.safetensors")):
            # random-NAME: what `--model random:NAME` writes; the benchmarks take that name, every command the path.
            random = path.name.startswith("random-")
            note = f"random:{path.name.removeprefix('random-')} in tacit bench / profile" if random else ""
            found.append(LocalModel(str(path), "safetensors", _size(path), "tacit cache", str(path), note))
    return found


def local_models() -> list[LocalModel]:
    """Everything servable without a download: tacit's cache first, then the Hugging Face cache."""
    found = tacit_cache_models()
    for m in cached_models():
        found.append(LocalModel(m.name, m.format, m.size_bytes, "huggingface cache", str(m.path)))
    return found


def searched_places() -> dict[str, str]:
    """The folders local_models() reads, for a listing that finds nothing to say where it looked."""
    return {"tacit cache": str(cache_dir()), "huggingface cache": str(hf_hub_cache())}
