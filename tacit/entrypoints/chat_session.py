"""`tacit chat`'s conversation: the turns so far, the slash commands, and the history trimmed
from its oldest turns when it would no longer fit the context (the model's max_model_len less
the reply's max_tokens).

Commands (a line starting with "/"): /clear forgets the turns (the system prompt stays),
/system TEXT sets the system prompt (/system alone removes it), /exit ends the session, /help
lists them; another "/word" is refused with that list, never sent to the model.
"""

from __future__ import annotations

from typing import Callable

COMMANDS = {
    "/clear": "forget the conversation (the system prompt stays)",
    "/system TEXT": "set the system prompt (/system alone removes it)",
    "/exit": "end the session",
    "/help": "this list",
}
HELP = "\n".join(f"  {name:<13} {what}" for name, what in COMMANDS.items())


class ChatSession:
    def __init__(self, encode: Callable[[list[dict]], list[int]], context: int, system: str | None = None) -> None:
        """encode: the messages -> the prompt's token ids (the chat template); context: the tokens
        a prompt may take (max_model_len less the reply's max_tokens)."""
        self.encode = encode
        self.context = context
        self.system = system
        self.turns: list[dict] = []

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def command(self, line: str) -> str | None:
        """Carry out a slash command -> what to print, or None for a line that is not one.
        Raises SystemExit(0) for /exit."""
        if not line.startswith("/"):
            return None
        name, _, rest = line.partition(" ")
        if name == "/exit":
            raise SystemExit(0)
        if name == "/clear":
            self.turns = []
            return "(conversation cleared)"
        if name == "/system":
            self.system = rest.strip() or None
            return f"(system prompt {'set' if self.system else 'removed'})"
        if name == "/help":
            return HELP
        return f"unknown command {name}; the commands are:\n{HELP}"

    def prompt(self, user: str) -> tuple[list[int], int]:
        """Add the user's turn -> (the prompt's token ids, how many earlier turns were dropped to
        fit the context). A turn that does not fit even alone is refused (ValueError) and not kept."""
        self.turns.append({"role": "user", "content": user})
        dropped = 0
        while True:
            ids = self.encode(self.messages())
            if len(ids) <= self.context:
                return ids, dropped
            if len(self.turns) == 1:
                self.turns.pop()
                raise ValueError(
                    f"this message takes {len(ids)} tokens with the system prompt, more than the {self.context} "
                    f"the context leaves for a prompt; shorten it, or start with a larger --max-model-len"
                )
            # The oldest turn goes (a user turn with its answer: the conversation stays in pairs).
            del self.turns[: 2 if len(self.turns) > 2 else 1]
            dropped += 1

    def answered(self, reply: str) -> None:
        self.turns.append({"role": "assistant", "content": reply})
