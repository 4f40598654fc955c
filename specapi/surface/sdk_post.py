"""What makes specapi's clients an `openai.OpenAI` beyond the two speculating resources: the SDK's
low-level `post` to `/completions` or `/chat/completions` goes through `create` (LiteLLM sends that
way), and `client.beta` keeps the SDK's beta resources beside the speculating `beta.chat.completions`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from openai import NotGiven

__all__ = ["Beta", "resource_for", "sdk_request"]


class Beta:
    """`client.beta`: `beta.chat.completions` is the speculating resource (LangChain streams structured
    output through `beta.chat.completions.stream`); the SDK's other beta resources are the SDK's."""

    def __init__(self, chat: Any, sdk_beta: Callable[[], Any]) -> None:
        self.chat = chat
        self._sdk_beta = sdk_beta

    def __getattr__(self, name: str) -> Any:
        # Any other beta resource: whatever the installed SDK's `beta` has (it changes between releases).
        return getattr(self._sdk_beta(), name)


#: The SDK's header asking for a raw response (what `with_raw_response` sends).
_RAW_RESPONSE_HEADER = "X-Stainless-Raw-Response"


def resource_for(client: Any, path: str) -> Any:
    """The speculating resource that serves `path` (a low-level SDK call), if one does."""
    normalized = "/" + path.strip("/")
    if normalized == "/completions":
        return client.completions
    if normalized == "/chat/completions":
        return client.chat.completions
    return None


def sdk_request(resource: Any, body: Mapping[str, Any], options: Any) -> tuple[dict[str, Any], bool]:
    """`create`'s arguments for a low-level SDK POST of `body` with the SDK's request `options`, and
    whether it asked for the raw response. Fields `create` does not name go as `extra_body`."""
    names = set(inspect.signature(resource.create).parameters)  # the declared parameters (see `dialects.openai_params.declared`)
    params = {k: v for k, v in body.items() if k in names and k not in ("extra_body", "extra_headers", "extra_query", "timeout")}
    extra = {k: v for k, v in body.items() if k not in params}
    options = dict(options or {})
    if isinstance(options.get("extra_json"), Mapping):
        extra.update(options["extra_json"])
    if extra:
        params["extra_body"] = extra
    headers = {k: v for k, v in dict(options.get("headers") or {}).items() if isinstance(v, str)}
    raw = any(k.lower() == _RAW_RESPONSE_HEADER.lower() and v.lower() in ("true", "raw") for k, v in headers.items())
    headers = {k: v for k, v in headers.items() if not k.lower().startswith("x-stainless")}
    if headers:
        params["extra_headers"] = headers
    if options.get("params"):
        params["extra_query"] = dict(options["params"])
    timeout = options.get("timeout")
    if timeout is not None and not isinstance(timeout, NotGiven):
        params["timeout"] = timeout
    return params, raw
