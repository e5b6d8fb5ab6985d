"""Models named by Hugging Face repo id (`Qwen/Qwen3-0.6B`, `ORG/NAME-GGUF:Q4_K_M`), found in the
local Hugging Face cache and never downloaded: tacit reads no network at run time, so a repo that
is not there is an error that says how to get it.

A GGUF repo holds one file per quantization; `ORG/NAME:TAG` picks one, the form llama.cpp's `-hf`
and Ollama's `hf.co/ORG/NAME:TAG` take: TAG is the quantization the file name ends with (Q4_K_M,
any case) or the whole file name. The cache is huggingface_hub's (snapshots/<rev>/, refs/main
naming the revision), read with its own offline calls."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# An owner and a name, each as the Hub allows them, then an optional :TAG. One slash only, so
# `./x`, `a/b/c` and absolute paths are never taken for a repo id.
_REPO_SPEC = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<tag>[\w.-]+))?")


def hf_hub_cache() -> Path:
    """huggingface_hub's cache directory, read from the environment at each call (its constants
    module reads it once, at import, so an HF_HUB_CACHE set later would go unseen): HF_HUB_CACHE,
    else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def split_repo_spec(model: str) -> tuple[str, str | None] | None:
    """("ORG/NAME", TAG or None) when `model` has a repo id's shape, else None."""
    m = _REPO_SPEC.fullmatch(model)
    return (m.group("repo"), m.group("tag")) if m else None


def resolve_model_path(model: str | Path) -> Path:
    """`model` as a local path when one exists there (a path keeps priority over a repo id), else
    the cached snapshot (or the chosen .gguf in it) of the repo id it names. A string that is
    neither comes back as a path, for the caller's missing-path error."""
    path = Path(model).expanduser()
    spec = split_repo_spec(str(model))
    if path.exists() or spec is None:
        return path
    repo_id, tag = spec
    return pick_file(repo_id, cached_snapshot(repo_id), tag)


def cached_snapshot(repo_id: str) -> Path:
    """The snapshot folder refs/main names for `repo_id`; FileNotFoundError (naming the id, the
    cache looked in and how to fill it) when it is not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hf_hub_cache()
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local path, nor a Hugging Face repo in the cache (looked in {cache}; "
            f"set HF_HUB_CACHE or HF_HOME to look elsewhere). tacit never downloads: fetch it on a machine with "
            f"network with `huggingface-cli download {repo_id}` (into that cache), or pass a local model directory "
            f"or .gguf file"
        ) from None


def gguf_files(snapshot: Path) -> list[Path]:
    """The model .gguf files of a snapshot, sorted; a vision projector (mmproj-*.gguf, which
    llama.cpp's -hf also sets aside) is not a model tacit can serve."""
    return sorted(p for p in snapshot.rglob("*.gguf") if not p.name.lower().startswith("mmproj"))


def matches_tag(file: Path, tag: str) -> bool:
    """TAG is the file's name, or the quantization its name ends with after a '.', '-' or '_'."""
    name, tag = file.name.lower(), tag.lower()
    stem = name.removesuffix(".gguf")
    return name == tag or stem == tag or any(stem.endswith(sep + tag) for sep in ".-_")


def pick_file(repo_id: str, snapshot: Path, tag: str | None) -> Path:
    """What to load from a repo's snapshot: the folder itself for a Hugging Face checkpoint
    (config.json), else its .gguf file, chosen by `tag` when it holds several."""
    ggufs = gguf_files(snapshot)
    if tag is None:
        if (snapshot / "config.json").exists() or not ggufs:
            return snapshot  # the loader names what a checkpoint without config.json lacks
        if len(ggufs) == 1:
            return ggufs[0]
        raise ValueError(
            f"model {repo_id!r} holds {len(ggufs)} .gguf files; choose one as {repo_id}:TAG, with TAG one of: "
            f"{', '.join(gguf_tag(repo_id, snapshot, f) for f in ggufs)}"
        )
    chosen = [f for f in ggufs if matches_tag(f, tag)]
    if len(chosen) == 1:
        return chosen[0]
    if not ggufs:
        raise ValueError(
            f"model '{repo_id}:{tag}': :TAG chooses a .gguf file and {repo_id} holds none (it is a Hugging Face "
            f"checkpoint); pass {repo_id!r}"
        )
    valid = ", ".join(gguf_tag(repo_id, snapshot, f) for f in ggufs)
    what = "matches none" if not chosen else f"matches {len(chosen)}"
    raise ValueError(f"model '{repo_id}:{tag}': {tag!r} {what} of its .gguf files; valid tags: {valid}")


def gguf_tag(repo_id: str, snapshot: Path, file: Path) -> str:
    """The shortest TAG that picks `file`: the quantization its name ends with when that is
    unambiguous in the snapshot (Q4_K_M), else the whole file name."""
    stem = file.name.removesuffix(".gguf")
    short = re.split(r"[.-]", stem)[-1]
    if short != stem and [f for f in gguf_files(snapshot) if matches_tag(f, short)] == [file]:
        return short
    return file.relative_to(snapshot).as_posix() if file.parent != snapshot else file.name


@dataclass(frozen=True)
class CachedModel:
    """One servable entry of the Hugging Face cache: `name` is what --model takes."""

    name: str
    format: str  # "safetensors" or "gguf"
    size_bytes: int
    path: Path


def cached_models() -> list[CachedModel]:
    """The model repos of the Hugging Face cache that refs/main resolves and tacit can load: a
    checkpoint (config.json and .safetensors) as ORG/NAME, each .gguf as ORG/NAME (the only one)
    or ORG/NAME:TAG. A cache that does not exist holds none."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(hf_hub_cache())
    except CacheNotFound:
        return []
    found: list[CachedModel] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        revision = repo.refs.get("main")
        if repo.repo_type != "model" or revision is None:
            continue
        snapshot = Path(revision.snapshot_path)
        sizes = {Path(f.file_path): f.size_on_disk for f in revision.files}
        if (snapshot / "config.json").exists() and any(p.suffix == ".safetensors" for p in sizes):
            found.append(CachedModel(repo.repo_id, "safetensors", revision.size_on_disk, snapshot))
            continue
        ggufs = gguf_files(snapshot)
        for f in ggufs:
            name = repo.repo_id if len(ggufs) == 1 else f"{repo.repo_id}:{gguf_tag(repo.repo_id, snapshot, f)}"
            found.append(CachedModel(name, "gguf", sizes.get(f, f.stat().st_size), f))
    return found


def display_name(model: str | None, path: Path) -> str:
    """How start-up lines name a loaded model: its file or folder name, or the repo id it was named
    by (the folder a repo id resolves to is named by a revision hash)."""
    if model is not None and not Path(model).expanduser().exists() and split_repo_spec(str(model)):
        return str(model)
    return path.name
