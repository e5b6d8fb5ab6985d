"""Models named by Hugging Face repo id, resolved in a local HF cache laid out as huggingface_hub
writes it (blobs/ by hash, snapshots/<rev>/ of symlinks, refs/main naming the revision), and
`tacit models` listing what can be served."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from tacit import LLM, SamplingParams
from tacit.cli import main
from tacit.config.engine_args import load_recipe
from tacit.loader.hf_cache import resolve_model_path


def put_in_hf_cache(hub: Path, repo_id: str, files: dict[str, bytes | Path], revision: str = "0123abcd") -> Path:
    """Write `files` (name -> bytes, or a file to copy) as repo_id's snapshot at `revision`, with
    refs/main naming it, as `huggingface-cli download` leaves them; the snapshot folder."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    for name, data in files.items():
        data = data.read_bytes() if isinstance(data, Path) else data
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty HF cache (HF_HUB_CACHE) and an empty tacit cache, so listings hold only what a test puts."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TACIT_CACHE_DIR", str(tmp_path / "tacit"))
    (tmp_path / "hub").mkdir()
    return tmp_path / "hub"


@pytest.fixture
def cached_tiny(hub, tiny_llama):
    _, _, path = tiny_llama
    return put_in_hf_cache(hub, "tiny-org/tiny-llama", {p.name: p for p in Path(path).iterdir() if p.is_file()})


GGUF_REPO = {"m-Q4_0.gguf": b"a", "m-Q8_0.gguf": b"bb", "m.Q4_K_M.gguf": b"ccc", "mmproj-m-f16.gguf": b"d"}


def test_a_repo_id_loads_the_cached_snapshot_and_generates_as_its_path(cached_tiny, tiny_llama):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    by_id = LLM("tiny-org/tiny-llama", dtype="float32")
    assert by_id.engine.source.path == cached_tiny
    assert by_id.engine.config.model.path == str(cached_tiny)  # what each worker opens: the resolved path
    ids = by_id.generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    assert ids == LLM(str(tiny_llama[2]), dtype="float32").generate([[5, 6, 7]], params)[0].outputs[0].token_ids


def test_an_absent_repo_id_names_the_id_the_cache_and_how_to_get_it(hub):
    with pytest.raises(FileNotFoundError) as e:
        LLM("nobody/absent-model")
    text = str(e.value)
    assert "'nobody/absent-model'" in text and str(hub) in text
    assert "huggingface-cli download nobody/absent-model" in text


def test_a_local_path_keeps_priority_over_a_repo_id(cached_tiny, tmp_path, monkeypatch):
    local = tmp_path / "tiny-org" / "tiny-llama"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("tiny-org/tiny-llama") == Path("tiny-org/tiny-llama")
    monkeypatch.chdir(local)
    assert resolve_model_path("tiny-org/tiny-llama") == cached_tiny


def test_a_gguf_repo_takes_the_tag_llama_cpp_and_ollama_take(hub):
    snap = put_in_hf_cache(hub, "o/m-GGUF", GGUF_REPO)
    assert resolve_model_path("o/m-GGUF:Q4_0") == snap / "m-Q4_0.gguf"
    assert resolve_model_path("o/m-GGUF:q4_k_m") == snap / "m.Q4_K_M.gguf"  # any case, after '.' or '-'
    assert resolve_model_path("o/m-GGUF:m-Q8_0.gguf") == snap / "m-Q8_0.gguf"  # or the whole file name
    with pytest.raises(ValueError, match=r"holds 3 \.gguf files; choose one as o/m-GGUF:TAG.*Q4_0, Q8_0, Q4_K_M"):
        resolve_model_path("o/m-GGUF")
    with pytest.raises(ValueError, match=r"'Q5_K' matches none of its \.gguf files; valid tags: Q4_0"):
        resolve_model_path("o/m-GGUF:Q5_K")
    one = put_in_hf_cache(hub, "o/one-GGUF", {"x.Q4_0.gguf": b"a", "mmproj-x.gguf": b"b"})
    assert resolve_model_path("o/one-GGUF") == one / "x.Q4_0.gguf"  # the only model file; a projector is not one


def test_a_tag_on_a_checkpoint_repo_is_refused_naming_it(cached_tiny):
    with pytest.raises(ValueError, match="tiny-org/tiny-llama holds none"):
        resolve_model_path("tiny-org/tiny-llama:Q4_0")


def test_tacit_models_lists_the_cached_repos_with_their_names_and_sizes(cached_tiny, hub, capsys):
    put_in_hf_cache(hub, "o/m-GGUF", GGUF_REPO)
    put_in_hf_cache(hub, "o/tokenizer-only", {"config.json": b"{}", "tokenizer.json": b"{}"})
    assert main(["models", "--json"]) == 0
    listed = {m["model"]: m for m in json.loads(capsys.readouterr().out)}
    assert set(listed) == {"tiny-org/tiny-llama", "o/m-GGUF:Q4_0", "o/m-GGUF:Q8_0", "o/m-GGUF:Q4_K_M"}
    tiny = listed["tiny-org/tiny-llama"]
    assert tiny["format"] == "safetensors" and tiny["source"] == "huggingface cache"
    assert tiny["size_bytes"] == sum(p.stat().st_size for p in cached_tiny.iterdir())
    assert listed["o/m-GGUF:Q8_0"]["size_bytes"] == 2
    for name in listed:  # every listed name loads as listed
        assert resolve_model_path(name).exists()
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["MODEL", "FORMAT", "SIZE", "WHERE"]
    assert any(line.startswith("tiny-org/tiny-llama ") and "huggingface cache" in line for line in lines)


def test_tacit_models_with_nothing_cached_says_where_it_looked(hub, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "no model found" in out and str(hub) in out and "tacit fetch" in out


def test_a_recipe_may_name_a_repo_id(cached_tiny, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: {path: tiny-org/tiny-llama}\n")
    assert load_recipe(recipe).engine_args["model"] == "tiny-org/tiny-llama"


def test_start_up_lines_name_a_repo_model_by_its_id_not_its_revision(cached_tiny, tiny_llama):
    from tacit.loader.hf_cache import display_name

    assert display_name("tiny-org/tiny-llama", cached_tiny) == "tiny-org/tiny-llama"
    assert display_name(str(tiny_llama[2]), Path(tiny_llama[2])) == Path(tiny_llama[2]).name
    assert display_name(None, Path("/x/SmolLM2.gguf")) == "SmolLM2.gguf"
