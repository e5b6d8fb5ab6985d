"""Structured output over HTTP: response_format (json_object, json_schema), vLLM's guided_*
fields and structured_outputs object, the official client's parse(), and the 400s."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from test_openai_server import Server  # noqa: E402

from tiny_models import build_hf_model  # noqa: E402

MESSAGES = [{"role": "user", "content": "Who are you?"}]


class Person(pydantic.BaseModel):
    name: Annotated[str, pydantic.Field(max_length=8)]
    age: Annotated[int, pydantic.Field(ge=0, le=150)]
    mood: Literal["happy", "sad"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("struct_llama")
    build_hf_model("llama", path)
    s = Server(path)
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{path}", json={"temperature": 0, "max_tokens": 200, **body}, timeout=60)


def test_openai_client_parse_returns_the_pydantic_object(client):
    completion = client.chat.completions.parse(
        model=None, messages=MESSAGES, response_format=Person, temperature=0, max_tokens=200
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    person = choice.message.parsed
    assert isinstance(person, Person) and len(person.name) <= 8 and 0 <= person.age <= 150


def test_json_object_on_chat_and_completions(server):
    # Prompts on which this random model closes its object within max_tokens (on others it
    # writes one endless key: the grammar bounds what, not how long).
    hi = [{"role": "user", "content": "Hi"}]
    chat = post(server, "chat/completions", messages=hi, response_format={"type": "json_object"})
    assert chat.status_code == 200, chat.text
    assert isinstance(json.loads(chat.json()["choices"][0]["message"]["content"]), dict)
    comp = post(server, "completions", prompt="Hello", response_format={"type": "json_object"})
    assert comp.status_code == 200, comp.text
    assert isinstance(json.loads(comp.json()["choices"][0]["text"]), dict)
    text = post(server, "completions", prompt="Hello", response_format={"type": "text"}, max_tokens=5)
    assert text.status_code == 200  # "text" is OpenAI's default: nothing to constrain


@pytest.mark.parametrize(
    "body, ok",
    [
        (dict(guided_choice=["left", "right"]), lambda t: t in ("left", "right")),
        (dict(guided_regex=r"[0-9]{3}-[a-z]{2}"), lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
        (dict(guided_grammar='root ::= "<" [a-c]{1,4} ">"'), lambda t: re.fullmatch(r"<[a-c]{1,4}>", t)),
        (
            dict(guided_json={"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}),
            lambda t: isinstance(json.loads(t)["x"], bool),
        ),
        (dict(structured_outputs={"choice": ["up", "down"]}), lambda t: t in ("up", "down")),
        (dict(structured_outputs={"regex": "z+!"}), lambda t: re.fullmatch("z+!", t)),
    ],
)
def test_vllm_fields_constrain_completions(server, body, ok):
    r = post(server, "completions", prompt="The answer is", **body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert ok(choice["text"]), choice


def test_streamed_chat_follows_the_grammar(client):
    stream = client.chat.completions.create(
        model=None,
        messages=MESSAGES,
        stream=True,
        temperature=0,
        max_tokens=50,
        extra_body={"guided_choice": ["alpha", "beta"]},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text in ("alpha", "beta")


@pytest.mark.parametrize(
    "body, param, message",
    [
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}),
            "response_format.json_schema.schema",
            "nonsense",
        ),
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format.json_schema.schema",
            "needs",
        ),
        (dict(guided_regex="(ab"), "guided_regex", "unclosed group"),
        (dict(guided_grammar="root ::= ("), "guided_grammar", "invalid"),
        (dict(structured_outputs={"regex": "(ab"}), "structured_outputs.regex", "unclosed group"),
        (dict(guided_choice=[]), "guided_choice", "non-empty list"),
        (
            dict(guided_regex="a", response_format={"type": "json_object"}),
            "guided_regex",
            "this request sets response_format, guided_regex",
        ),
        (
            dict(guided_json={}, structured_outputs={"json_object": True}),
            "structured_outputs",
            "this request sets guided_json, structured_outputs",
        ),
        (dict(structured_outputs={"regex": "a", "choice": ["a"]}), "structured_outputs", "exactly one"),
        (dict(structured_outputs={"structural_tag": "x"}), "structured_outputs.structural_tag", ""),
        (dict(guided_whitespace_pattern=" "), "guided_whitespace_pattern", "not supported"),
        (dict(response_format={"type": "xml"}), "response_format.type", ""),
    ],
)
def test_bad_structured_output_is_a_400_naming_the_field(server, body, param, message):
    for path, extra in (("chat/completions", dict(messages=MESSAGES)), ("completions", dict(prompt="Hi"))):
        r = post(server, path, **extra, **body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and message in error["message"], error
    assert httpx.get(f"{server.url}/health").status_code == 200
