"""POST /v1/images/generations on a real `tacit serve` (a tiny random SDXL diffusers directory),
through the official openai client's images.generate and raw httpx; and `tacit image`.

A --model that is a diffusion checkpoint serves images only (the LLM routes say so); --image-model
serves one beside a language model. Requests the model cannot take are 400s naming the field."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("diffusers")
from PIL import Image  # noqa: E402
from tiny_diffusion import write_diffusers_dir  # noqa: E402

from tacit.bench.launch import free_port, stop_process, wait_healthy  # noqa: E402

from tiny_models import build_hf_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class Server:
    def __init__(self, log: Path, *args: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "tacit.cli", "serve", *args, "--port", self.url.rsplit(":", 1)[1]]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.url, self.proc, 180, log.read_text)
        except RuntimeError:
            stop_process(self.proc)
            raise

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def post(self, body: dict) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/images/generations", json=body, timeout=120)


@pytest.fixture(scope="module")
def sdxl_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny_sdxl")
    write_diffusers_dir(path, "tiny_sdxl")
    return path


@pytest.fixture(scope="module")
def images_only(sdxl_dir, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("log") / "serve.log", "--model", str(sdxl_dir), "--served-model-name", "tiny")
    yield s
    assert stop_process(s.proc) == 0, s.log.read_text()


def png(b64: str) -> Image.Image:
    data = base64.b64decode(b64)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return Image.open(io.BytesIO(data))


def test_the_openai_client_gets_pngs_of_the_size_it_asked_for(images_only):
    r = images_only.client().images.generate(
        model="tiny",
        prompt="a red fox",
        n=2,
        size="64x32",
        response_format="b64_json",
        user="tester",
        extra_body={"steps": 2, "seed": 7, "guidance_scale": 3.0, "negative_prompt": "blur", "scheduler": "euler"},
    )
    assert len(r.data) == 2
    assert [png(d.b64_json).size for d in r.data] == [(64, 32)] * 2
    assert [d.model_extra["seed"] for d in r.data] == [7, 8]  # image i from seed + i
    assert r.model_extra["timings"]["denoise_s"] > 0
    # The same seed, prompt and settings make the same image, whatever else is in the batch.
    again = images_only.post(
        {
            "prompt": "a red fox",
            "size": "64x32",
            "steps": 2,
            "seed": 8,
            "guidance_scale": 3.0,
            "negative_prompt": "blur",
        }
    )
    assert again.status_code == 200, again.text
    alone, in_batch = (png(b64).tobytes() for b64 in (again.json()["data"][0]["b64_json"], r.data[1].b64_json))
    # Equal up to the last rounding: BLAS may sum a batch of 2 in another order than a batch of 1
    # (MKL on an AVX2-only EPYC did: float32 ~1e-6 apart), which moves a pixel that sits on a
    # rounding boundary to its neighbouring level; any real mix-up between images moves many by far more.
    diffs = [abs(a - b) for a, b in zip(alone, in_batch) if a != b]
    assert len(alone) == len(in_batch) and max(diffs, default=0) <= 1 and len(diffs) <= len(alone) // 100


def test_unset_size_is_the_models_native_size_and_jpeg_is_served(images_only):
    r = images_only.post({"prompt": "x", "steps": 1, "output_format": "jpeg", "output_compression": 80})
    assert r.status_code == 200, r.text
    body = r.json()
    data = base64.b64decode(body["data"][0]["b64_json"])
    assert data[:3] == b"\xff\xd8\xff" and body["output_format"] == "jpeg"
    side = Image.open(io.BytesIO(data)).size[0]
    assert body["size"] == f"{side}x{side}"


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"size": "102x64"}, "size", "width=102: must be a multiple of"),
        ({"size": "big"}, "size", "WIDTHxHEIGHT"),
        ({"steps": 0}, "steps", "steps=0: must be an integer between 1 and"),
        ({"num_inference_steps": 100000}, "steps", "steps=100000"),
        ({"n": 0}, "n", "n=0"),
        ({"scheduler": "ddim-ish"}, "scheduler", "must be one of"),
        ({"response_format": "url"}, "response_format", "keeps no image files"),
        ({"quality": "hd"}, "quality", "not honoured"),
        ({"style": "vivid"}, "style", "not honoured"),
        ({"background": "transparent"}, "background", "opaque"),
        ({"stream": True}, "stream", "does not support this field"),
        ({"cfg_rescale": 0.7}, "cfg_rescale", "does not support this field"),
        ({"output_compression": 50}, "output_compression", "jpeg and webp only"),
    ],
)
def test_what_the_model_cannot_take_is_a_400_naming_the_field(images_only, body, param, words):
    steps = {} if "num_inference_steps" in body else {"steps": 1}  # both names at once is itself a 400
    r = images_only.post({"prompt": "x", **steps, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_the_client_raises_bad_request_for_a_url_response(images_only):
    with pytest.raises(openai.BadRequestError, match="b64_json"):
        images_only.client().images.generate(prompt="x", response_format="url", extra_body={"steps": 1})


def test_an_images_only_server_says_its_llm_routes_need_a_language_model(images_only):
    r = httpx.post(f"{images_only.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    assert "needs a language model" in r.json()["error"]["message"] and "--image-model" in r.json()["error"]["message"]
    assert [m.id for m in images_only.client().models.list().data] == ["tiny"]
    wrong = images_only.post({"prompt": "x", "model": "dall-e-3", "steps": 1})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"


def test_image_model_beside_a_language_model(sdxl_dir, tmp_path_factory):
    llama = tmp_path_factory.mktemp("llama")
    build_hf_model("llama", llama)
    s = Server(
        tmp_path_factory.mktemp("log") / "both.log",
        "--model", str(llama), "--dtype", "float32", "--image-model", str(sdxl_dir), "--max-image-batch", "2",
    )  # fmt: skip
    try:
        client = s.client()
        assert {m.id for m in client.models.list().data} == {str(llama), str(sdxl_dir)}
        chat = client.chat.completions.create(
            model=str(llama), messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert chat.choices[0].message.content is not None
        r = client.images.generate(model=str(sdxl_dir), prompt="a cat", size="32x32", extra_body={"steps": 1})
        assert png(r.data[0].b64_json).size == (32, 32)
    finally:
        assert stop_process(s.proc) == 0, s.log.read_text()


def test_tacit_image_writes_the_pngs_and_prints_the_seed(sdxl_dir, tmp_path, capsys):
    from tacit.cli import main

    out = tmp_path / "fox.png"
    args = ["image", "--model", str(sdxl_dir), "--prompt", "a fox", "--out", str(out), "--n", "2"]
    assert main([*args, "--steps", "2", "--width", "32", "--height", "64", "--seed", "11"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(out), str(tmp_path / "fox-1.png")]
    assert "seed 11" in captured.err and "2/2" in captured.err  # the seed, and the progress bar's last step
    assert Image.open(out).size == (32, 64) and Image.open(tmp_path / "fox-1.png").format == "PNG"
    assert main([*args, "--steps", "2", "--width", "30"]) == 2
    assert "width=30: must be a multiple of" in capsys.readouterr().err
