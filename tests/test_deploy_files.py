"""The Dockerfile and deploy/tacit.service, checked without Docker or systemd running: no Docker
daemon is needed (CI has none), so the image itself is never built here; what is checked is what
would break it or the service first."""

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tacit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _pinned_torch() -> str:
    pyproject = (ROOT / "pyproject.toml").read_text()
    return re.search(r'"(torch==[^"]+)"', pyproject).group(1)


def test_the_dockerfile_pins_torch_as_pyproject_does_before_installing_tacit():
    steps = _dockerfile()
    runs = [args for op, args in steps if op == "RUN"]
    torch_step = next(i for i, r in enumerate(runs) if "torch" in r and "pip install" in r)
    assert _pinned_torch() in shlex.split(runs[torch_step]), runs[torch_step]  # never a bare `torch`
    tacit_step = next(i for i, r in enumerate(runs) if "'.[serve]'" in r)
    assert torch_step < tacit_step  # the package's own torch requirement is then already met
    assert steps[0] == ("FROM", "python:3.11-slim")


def test_every_path_the_dockerfile_copies_exists():
    copies = [shlex.split(args) for op, args in _dockerfile() if op == "COPY"]
    assert copies
    for *sources, _dest in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile COPYs {source}, which is not in the repository"
    copied = {s for *sources, _ in copies for s in sources}
    assert {"pyproject.toml", "tacit"} <= copied and "README.md" in copied  # pyproject's readme= needs it


def test_every_file_the_package_reads_is_package_data():
    """The image installs tacit without -e (`pip install '.[serve]'`), as a wheel does: a file under
    tacit/ that package-data does not name is left out, and what reads it fails there only
    (perf_model/data's efficiency.json and the shared-memory all-reduce's C++ were, until named)."""
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tacit"]
    named = {p for pattern in patterns for p in (ROOT / "tacit").glob(pattern)}
    data = {
        p
        for p in (ROOT / "tacit").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    assert data, "no data files found under tacit/"
    missing = sorted(str(p.relative_to(ROOT)) for p in data - named)
    assert not missing, f"not in pyproject's [tool.setuptools.package-data]: {missing}"


def test_the_image_serves_on_all_interfaces_as_a_non_root_user_with_the_default_model():
    steps = _dockerfile()
    entry = next(json.loads(args) for op, args in steps if op == "ENTRYPOINT")
    assert entry[:2] == ["tacit", "serve"] and entry[entry.index("--host") + 1] == "0.0.0.0"
    port = entry[entry.index("--port") + 1]
    assert ("EXPOSE", port) in steps
    build_parser().parse_args(entry[1:])  # the flags are tacit serve's
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1] != "root"
    after_user = steps[steps.index(("USER", users[-1])) :]
    assert ("RUN", "tacit fetch") in after_user  # fetched into the serving user's cache, at build time


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(ROOT / "deploy" / "tacit.service")
    return unit


def test_the_systemd_unit_restarts_on_failure_as_its_own_user_and_stops_with_sigterm():
    service = _unit()["Service"]
    assert service["Restart"] == "on-failure"
    assert service["User"] not in ("", "root")
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    env_file = service["EnvironmentFile"]
    assert not env_file.startswith("-")  # no key file, no start (a '-' would start it without a key)
    example = (ROOT / "deploy" / "tacit.env.example").read_text()
    assert re.search(r"^TACIT_API_KEY=", example, re.M)  # what tacit serve reads as --api-key
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/tacit") and argv[1] == "serve"
    args = build_parser().parse_args(argv[1:])
    # The drain must end before systemd's SIGKILL.
    assert args.shutdown_timeout < float(service["TimeoutStopSec"])
    assert _unit()["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    # verify also checks that ExecStart's program exists: /opt/tacit is not installed here, so the
    # copy checked runs this environment's tacit; every other line is verified as written.
    text = (ROOT / "deploy" / "tacit.service").read_text()
    here = str(Path(sys.executable).with_name("tacit"))
    if not Path(here).exists():
        pytest.skip(f"{here} is not installed (pip install -e .)")
    unit = tmp_path / "tacit.service"
    unit.write_text(text.replace("/opt/tacit/.venv/bin/tacit", here))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # A bad key or value is only a warning (exit 0), naming the file: both count.
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if "tacit.service" in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr
