import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from near_ties import save_bf16_valued  # noqa: E402

from tiny_models import build_hf_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Build each tiny architecture once per session: (hf_model, tokenizer, path)."""
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            path = tmp_path_factory.mktemp(arch)
            model, tok = build_hf_model(arch, path)
            cache[arch] = (model, tok, path)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_bf16_valued_model_factory(tmp_path_factory):
    """Each tiny architecture with its weights rounded to bf16 (see near_ties.save_bf16_valued),
    built once per session: (hf_model, tokenizer, path)."""
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            path = tmp_path_factory.mktemp(f"{arch}_bf16_valued")
            model, tok = build_hf_model(arch, path)
            cache[arch] = (model, tok, save_bf16_valued(model, path))
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture
def bf16_ggml_activations(monkeypatch):
    """Engines built in the test multiply GGML decode rows against bf16 activations (the
    dequantized model's arithmetic) instead of llama.cpp's int8-per-block ones, for tests that
    compare tokens exactly: TACIT_GGML_BF16_ACTIVATIONS=1, EngineArgs.ggml_bf16_activations' default."""
    monkeypatch.setenv("TACIT_GGML_BF16_ACTIVATIONS", "1")


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib made unimportable, as on an install without the bench extra."""
    import builtins

    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


@pytest.fixture(scope="session", autouse=True)
def calibration_dir(tmp_path_factory):
    """Tests never run this CPU's full calibration fit (about a minute; calibration.run_fit
    refuses) nor read or write the user's cached one: the calibration directory is a session
    temp dir, empty until a test seeds it (this_cpu_calibrated)."""
    from tacit.perf_model import calibration

    d = tmp_path_factory.mktemp("calibration")

    def refuse(repeats):
        raise AssertionError("a test asked for this CPU's full calibration fit: use the this_cpu_calibrated fixture")

    probe_now = calibration.current_peaks

    def session_peaks(spec=None):
        # The peaks a lookup compares with, measured once for the session (this_cpu_spec): a
        # tool measures them on every lookup, and two probes seconds apart on the shared machine
        # can differ past the drift margin, which would make a test ask for a refit.
        from tacit.platforms.hardware_table import this_cpu_spec

        return probe_now(spec or this_cpu_spec())

    mp = pytest.MonkeyPatch()
    mp.setattr(calibration, "calibration_dir", lambda: d)
    mp.setattr(calibration, "run_fit", refuse)
    mp.setattr(calibration, "current_peaks", session_peaks)
    yield d
    mp.undo()


def seed_this_cpu_calibration(roofs: dict | None = None) -> Path:
    """A calibration file for this machine's key holding the reference fit in efficiency.json
    (vm-2vcpu-no-amx-1thread) at `roofs` (default: this process's measured peaks, so it matches)."""
    import json

    from tacit.perf_model.calibration import FIT_VERSION, calibration_path, current_peaks, machine_key
    from tacit.perf_model.efficiency import DATA

    profile = json.loads(DATA.read_text())["vm-2vcpu-no-amx-1thread"]
    roofs = roofs or current_peaks()
    key = machine_key()
    assert key["fit_version"] == FIT_VERSION
    data = {"key": key, "command": "seeded by the tests", "fitted_at": "2026-12-05T05:45:26", "fit_seconds": 0.0,
            "profile": {**profile, "roofs": {**roofs, "threads": key["threads"]}}}  # fmt: skip
    path = calibration_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="session")
def this_cpu_calibrated(calibration_dir):
    """`this-cpu` priced without a fit: this machine's calibration seeded with the reference fit."""
    return seed_this_cpu_calibration()
