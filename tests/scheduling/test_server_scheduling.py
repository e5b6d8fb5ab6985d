"""Scheduling through `tacit serve`: the policy flag, SLO fields, the sla admission error a client
sees, the predictor's error on /metrics, and bad flags refused before the model loads."""

import subprocess
import sys

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from entrypoints.test_openai_server import REPO, Server  # noqa: E402


@pytest.fixture(scope="module")
def sla_server(tiny_llama, tmp_path_factory):
    # The policy comes from the flag, over the recipe's; the SLO classes from the recipe.
    recipe = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    recipe.write_text(
        "scheduler:\n  policy: priority\n  slo_classes: {0: {ttft_ms: 60000, tpot_ms: 5000}, 5: {ttft_ms: 0.001}}\n"
    )
    s = Server(tiny_llama[2], "--recipe", str(recipe), "--scheduling-policy", "sla")
    yield s
    assert s.stop() == 0, "".join(s.log)


def test_sla_server_admits_rejects_and_reports(sla_server, tiny_llama):
    url = f"{sla_server.url}/v1/completions"
    body = {"prompt": "Hello there", "max_tokens": 4, "temperature": 0.0}
    for hint in (None, 4):
        r = httpx.post(url, json={**body, "expected_output_tokens": hint} if hint else body, timeout=60)
        assert r.status_code == 200, r.text
    r = httpx.post(url, json={**body, "ttft_slo_ms": 0.0001}, timeout=60)
    assert r.status_code == 503 and r.headers.get("retry-after")
    err = r.json()["error"]
    assert err["param"] == "ttft_slo_ms" and "ttft_slo_ms=0" in err["message"] and "estimates" in err["message"]
    r = httpx.post(url, json={**body, "priority": 5}, timeout=60)  # the recipe's class 5 target
    assert r.status_code == 503 and "ttft_slo_ms=0" in r.json()["error"]["message"]
    r = httpx.post(url, json={**body, "tpot_slo_ms": -1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tpot_slo_ms"
    m = sla_server.metrics()
    assert m['tacit_requests_total{finish_reason="slo_rejected"}'] == 2
    assert m["tacit_output_length_predictor_scored_total"] == 2
    assert "tacit_output_length_predictor_mae" in m
    r = httpx.post(url, json=body, timeout=60)  # still serving
    assert r.status_code == 200


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--scheduling-policy", "lifo"], "scheduling_policy='lifo' is not known; valid: fcfs, priority, sjf, sla"),
        (["--slo-class", "fast"], "--slo-class 'fast' is invalid"),
        (["--preemption-mode", "drop"], "preemption_mode='drop' is not known"),
    ],
)
def test_serve_refuses_bad_scheduling_flags(tiny_llama, flags, match):
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "serve", "--model", str(tiny_llama[2]), *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and match in r.stderr, r.stderr
