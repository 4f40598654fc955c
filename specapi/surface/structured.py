"""`chat.completions.parse` and `chat.completions.stream`: the openai SDK's structured-output helpers on
specapi's resources.

    completion = await client.chat.completions.parse(messages=[...], response_format=Answer)
    completion.choices[0].message.parsed        # an `Answer`
    async with client.chat.completions.stream(messages=[...]) as stream:
        async for event in stream: ...          # the SDK's events (`content.delta`, ...)

The request goes through `create`, so it speculates where the request allows it: a `response_format`
or `tools` constrains what the target may write, which verification cannot reproduce, so such a
request goes to the target alone (the reason is in `speculative.fallback_reason`). The pydantic model
is turned into a JSON schema and the answer parsed back by the SDK's own helpers, so the result is
what the SDK would return for the target's answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openai import Omit, omit

from ..transport._sdk import parse_chat_completion, type_to_response_format_param, validate_input_tools
from ..core.types import SpeculativeParsedChatCompletion

__all__ = ["helper_arguments", "parse_params", "stream_params", "parsed_completion"]


def helper_arguments(params: Mapping[str, Any], response_format: Any) -> dict[str, Any]:
    """A `parse` or `stream` call's arguments (`params`: all but `response_format`) in one mapping:
    the others first, then `messages`, `model`, `response_format` and `tools` (the order in which an
    unverifiable argument is named)."""
    if "messages" not in params:
        raise TypeError("missing a required keyword-only argument: 'messages'")
    others = {name: value for name, value in params.items() if name not in ("messages", "model", "tools")}
    return {**others, "messages": params["messages"], "model": params.get("model"), "response_format": response_format, "tools": params.get("tools", omit)}


def parse_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """`create`'s arguments for a `parse` call (the schema as the API's `response_format`), the rich
    response format and the tools to parse the answer with."""
    response_format = params.get("response_format", omit)
    request = {name: value for name, value in params.items() if name != "stream"}
    tools = params.get("tools", omit)
    if not isinstance(tools, Omit):
        tools = request["tools"] = list(tools)  # read twice: sent, then used to parse the answer
    validate_input_tools(tools)  # only strict function tools can be parsed; the SDK's own error otherwise
    return _with_schema(request, response_format), response_format, tools


def stream_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """`create`'s arguments for a `stream` call (a stream, with the schema as the API's `response_format`)."""
    response_format = params.get("response_format", omit)
    request = {**params, "stream": True}
    tools = params.get("tools", omit)
    if not isinstance(tools, Omit):
        tools = request["tools"] = list(tools)  # read twice: sent, then used to parse the answer
    return _with_schema(request, response_format), response_format, tools


def _with_schema(request: dict[str, Any], response_format: Any) -> dict[str, Any]:
    schema = type_to_response_format_param(response_format)
    if isinstance(schema, Omit):
        request.pop("response_format", None)
    else:
        request["response_format"] = schema
    return request


def parsed_completion(completion: Any, response_format: Any, tools: Any) -> SpeculativeParsedChatCompletion[Any]:
    """The SDK's `ParsedChatCompletion` of `completion` (`message.parsed`, parsed tool calls), with its statistics."""
    parsed = parse_chat_completion(response_format=response_format, input_tools=tools, chat_completion=completion)
    fields = {name: getattr(parsed, name) for name in parsed.model_fields_set}  # the fields the SDK set, by name
    result = SpeculativeParsedChatCompletion.model_construct(_fields_set=set(fields), **fields, **(parsed.model_extra or {}))
    result.speculative = completion.speculative
    return result

