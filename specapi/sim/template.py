"""The simulated models' chat template: messages to prompt text.

Each message is ``<|role|>`` on a line, then its content and a newline; the generation prompt is
``<|assistant|>`` and a newline. The markers are plain text (they tokenize as ordinary tokens). A final
assistant message can instead be left open (no newline after it) so the model continues it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["GENERATION_PROMPT", "message_text", "render_chat"]

GENERATION_PROMPT = "<|assistant|>\n"
_ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message's ``content`` (a string, a list of text parts, or null)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError("content must be a string or a list of text parts")


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """Prompt text for ``messages``.

    ``continue_final_message``: the last message (an assistant's) stays open, to be continued.
    ``add_generation_prompt``: end with the assistant marker (ignored when continuing).
    Raises ``ValueError`` on an unknown role or non-text content.
    """
    pieces = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in _ROLES:
            raise ValueError(f"unknown role {role!r}")
        text = message_text(message)
        if continue_final_message and index == len(messages) - 1:
            pieces.append(f"<|{role}|>\n{text}")
            return "".join(pieces)
        pieces.append(f"<|{role}|>\n{text}\n")
    if add_generation_prompt:
        pieces.append(GENERATION_PROMPT)
    return "".join(pieces)
