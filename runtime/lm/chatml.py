"""The Qwen ChatML format, built by the runtime (no template engine).

A conversation renders as Qwen2.5's chat template does::

    <|im_start|>system\n{system}<|im_end|>\n
    <|im_start|>user\n{text}<|im_end|>\n
    <|im_start|>assistant\n{reply}<|im_end|>\n
    ...
    <|im_start|>assistant\n            (the generation prompt)

``default_system`` is the system block the checkpoint's template inserts when the conversation
has none (Qwen2.5: "You are Qwen, ..."; None: no block). A chat session feeds the same text turn
by turn (``first_turn``, then ``next_turn``, which first closes the previous reply), so the
KV cache holds exactly the rendered conversation. Every piece starts at a special token, where
the tokenizer splits first: tokenized piece by piece it gives the ids of the whole text.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from kztts.core.errors import KzttsError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant")


def block(role: str, content: str) -> str:
    """One finished message."""
    if role not in ROLES:
        raise KzttsError(f"chat role {role!r}: expected one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise KzttsError(f"chat {role} content must be a string, got {type(content).__name__}")
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def generation_prompt() -> str:
    return f"{IM_START}assistant\n"


def system_prefix(system: str | None) -> str:
    return "" if system is None else block("system", system)


def render(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
           default_system: str | None = None) -> str:
    """The whole conversation (``[{"role", "content"}]``) as ChatML text."""
    msgs = list(messages)
    first_system = bool(msgs) and msgs[0].get("role") == "system"
    out = [] if first_system else [system_prefix(default_system)]
    out += [block(m["role"], m["content"]) for m in msgs]
    if add_generation_prompt:
        out.append(generation_prompt())
    return "".join(out)


def first_turn(system: str | None, user: str) -> str:
    """What a session feeds for its first message: the system block, the user's, the generation prompt."""
    return system_prefix(system) + block("user", user) + generation_prompt()


def next_turn(user: str) -> str:
    """What a session feeds for a later message: the end of the previous reply, then as ``first_turn``."""
    return f"{IM_END}\n" + block("user", user) + generation_prompt()
