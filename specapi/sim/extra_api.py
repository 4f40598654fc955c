"""The simulator's OpenAI routes besides completions and chat: embeddings and the Responses API, as far
as a client (or a proxy passing them on) needs them.

    POST /v1/embeddings  {model, input, encoding_format?}
        served by the "openai" and "llamacpp" profiles (llama-server serves it when started with
        `--embeddings`); vLLM serves it for pooling models only, so the "vllm" profile, whose models
        generate, answers 404 as vLLM does for a route it did not register (`{"detail": "Not Found"}`).
    POST /v1/responses   {model, input, instructions?, max_output_tokens?, temperature?, top_p?, seed?, stream?}
        served by the "openai" and "vllm" profiles: the chat completion of the same messages, in the
        Responses shape; streamed as named events (`response.created`, one `response.output_text.delta`
        per chunk of text, `response.output_text.done`, `response.completed`).

An embedding is a function of the text's tokens alone (hashed token counts, L2-normalised,
`EMBEDDING_DIM` floats): equal texts get equal vectors, as from a real model.
"""

from __future__ import annotations

import base64
import json
import math
import os
import struct
import time
from collections.abc import AsyncGenerator
from typing import Any

from .corpus import encode_text
from .params import ApiError

__all__ = ["EMBEDDING_DIM", "EMBEDDING_PROFILES", "RESPONSES_PROFILES", "embeddings", "responses_chat_body", "response_object", "new_response_id", "ResponseEvents"]

EMBEDDING_DIM = 32
#: The profiles (`Capabilities.dialect`) that serve each route.
EMBEDDING_PROFILES = frozenset({"openai", "llamacpp"})
RESPONSES_PROFILES = frozenset({"openai", "vllm"})


def _vector(ids: list[int]) -> list[float]:
    vector = [0.0] * EMBEDDING_DIM
    for position, token in enumerate(ids):
        vector[(token * 2654435761) % EMBEDDING_DIM] += 1.0 + (position % 3) * 0.25
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [round(v / norm, 6) for v in vector]


def _inputs(value: Any) -> list[list[int]]:
    """`input` as token ids per item: a string, a list of strings, a list of ids, or a list of id lists."""
    if isinstance(value, str):
        return [encode_text(value)]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return [encode_text(v) for v in value]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [list(value)]
        if all(isinstance(v, list) and v and all(isinstance(i, int) for i in v) for v in value):
            return [list(v) for v in value]
    raise ApiError(400, "input must be a non-empty string, list of strings, or list of token ids", param="input")


def embeddings(body: dict[str, Any], model: str) -> dict[str, Any]:
    """`/v1/embeddings`'s answer (`encoding_format` "float", the default, or "base64": little-endian float32)."""
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise ApiError(400, "encoding_format must be 'float' or 'base64'", param="encoding_format")
    items = _inputs(body.get("input"))
    data = []
    for index, ids in enumerate(items):
        vector = _vector(ids)
        value: Any = vector if encoding == "float" else base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": value})
    tokens = sum(len(ids) for ids in items)
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise ApiError(400, "each input message needs text content", param="input")


def responses_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request the Responses request `body` amounts to."""
    given = body.get("input")
    if isinstance(given, str):
        messages = [{"role": "user", "content": given}]
    elif isinstance(given, list) and given and all(isinstance(m, dict) for m in given):
        messages = [{"role": m.get("role", "user"), "content": _text(m.get("content"))} for m in given]
    else:
        raise ApiError(400, "input must be a string or a list of messages", param="input")
    if isinstance(body.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for name in ("temperature", "top_p", "seed"):
        if name in body:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def response_object(body: dict[str, Any], response_id: str, text: str, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
    """A Responses API `response` object holding `text` (status from the chat's finish reason)."""
    complete = finish_reason != "length"
    usage = usage or {}
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()),
        "status": "completed" if complete else "incomplete",
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "model": body.get("model"), "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "output": [{
            "type": "message", "id": "msg_" + response_id[len("resp_"):], "status": "completed" if complete else "incomplete",
            "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}],
        }],
        "usage": {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion},
    }  # fmt: skip


def new_response_id() -> str:
    return "resp_" + os.urandom(12).hex()


class ResponseEvents:
    """A chat stream told again as the Responses API's named events; iterate it for bytes, as `SSEStream`."""

    def __init__(self, chat_stream: Any, body: dict[str, Any]) -> None:
        self._chat = chat_stream
        self._body = body
        self._id = new_response_id()
        self._events = self._retold()

    def __aiter__(self) -> ResponseEvents:
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()
        await self._chat.aclose()

    def _event(self, kind: str, sequence: int, **fields: Any) -> bytes:
        return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, "sequence_number": sequence, **fields}).encode() + b"\n\n"

    async def _retold(self) -> AsyncGenerator[bytes, None]:
        item_id = "msg_" + self._id[len("resp_"):]
        started = response_object(self._body, self._id, "", None, None)
        started.update(status="in_progress", output=[], usage=None)
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
        place = {"item_id": item_id, "output_index": 0, "content_index": 0}
        yield self._event("response.created", 0, response=started)
        yield self._event("response.output_item.added", 1, output_index=0, item=item)
        yield self._event("response.content_part.added", 2, **place, part={"type": "output_text", "text": "", "annotations": []})
        sequence, text, finish, usage = 3, [], None, None
        async for data in self._chat:
            for block in data.split(b"\n\n"):
                if not block.startswith(b"data: ") or block == b"data: [DONE]":
                    continue
                chunk = json.loads(block[len(b"data: "):])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content")
                    finish = choice.get("finish_reason") or finish
                    if delta:
                        text.append(delta)
                        yield self._event("response.output_text.delta", sequence, **place, delta=delta, logprobs=[])
                        sequence += 1
        final = response_object(self._body, self._id, "".join(text), finish, usage)
        message = final["output"][0]
        yield self._event("response.output_text.done", sequence, **place, text=message["content"][0]["text"], logprobs=[])
        yield self._event("response.content_part.done", sequence + 1, **place, part=message["content"][0])
        yield self._event("response.output_item.done", sequence + 2, output_index=0, item=message)
        yield self._event("response.completed" if final["status"] == "completed" else "response.incomplete", sequence + 3, response=final)
