"""`tacit chat`'s session: slash commands, the history trimmed from its oldest turns to fit the
context (with a notice), a message too long on its own refused without losing the session, and
the whole thing driven through the real command with piped input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tacit.entrypoints.chat_session import HELP, ChatSession


def _words(messages: list[dict]) -> list[int]:
    """A stand-in chat template: one token a word, two per message for its framing."""
    return [0] * sum(2 + len(m["content"].split()) for m in messages)


def test_commands_change_the_session_and_are_never_sent():
    s = ChatSession(_words, 100, system="Be brief.")
    s.prompt("hello there")
    s.answered("hi")
    assert s.command("what is this") is None
    assert s.command("/system Answer in French.") == "(system prompt set)"
    assert s.messages()[0] == {"role": "system", "content": "Answer in French."}
    assert s.command("/clear") == "(conversation cleared)"
    assert s.messages() == [{"role": "system", "content": "Answer in French."}]
    assert s.command("/system") == "(system prompt removed)" and s.messages() == []
    assert s.command("/help") == HELP and "/clear" in HELP
    assert s.command("/bogus").startswith("unknown command /bogus")
    with pytest.raises(SystemExit):
        s.command("/exit")


def test_the_oldest_turns_go_first_when_the_history_outgrows_the_context():
    s = ChatSession(_words, 20, system="sys")  # system: 3 tokens
    for i in range(3):
        ids, dropped = s.prompt(f"question {i} a b")  # 6 tokens each
        assert dropped == 0 or i == 2
        s.answered("answer c")  # 4 tokens each
    # Before the third answer: 3 + (6 + 4) * 2 + 6 = 29 > 20: the first pair went.
    assert [m["content"] for m in s.turns] == ["question 1 a b", "answer c", "question 2 a b", "answer c"]
    assert dropped == 1 and len(ids) <= 20


def test_a_message_too_long_alone_is_refused_and_the_session_goes_on():
    s = ChatSession(_words, 10)
    s.prompt("short")
    s.answered("ok")
    with pytest.raises(ValueError, match="more than the 10 the context leaves"):
        s.prompt("one two three four five six seven eight nine ten")
    ids, _ = s.prompt("again")
    assert s.turns[-1] == {"role": "user", "content": "again"} and len(ids) <= 10


def test_tacit_chat_runs_the_commands_from_piped_input(tiny_llama):
    script = "/help\nhello\n/system Be brief.\n/clear\nagain\n/exit\nnever read\n"
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "chat", "--model", str(tiny_llama[2]), "--dtype", "float32"]
        + ["--max-tokens", "4", "--top-k", "5"],
        input=script,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "/clear" in out and "(system prompt set)" in out and "(conversation cleared)" in out
    assert out.count("\n") >= 6  # help lines, two replies, the two notices
