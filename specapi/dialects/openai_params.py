"""The parameters of the OpenAI formats' `create` calls, declared once for every client resource.

The async and the sync client take the same keyword arguments as the openai SDK's resources, with the
SDK's names and types (`openai.types.completion_create_params`, `openai.types.chat.completion_create_params`)
plus specapi's extension (`prediction` on completions) and the SDK's per-call options (`extra_headers`,
`extra_query`, `extra_body`, `timeout`). Each resource declares them here as a `TypedDict` that its
methods take as `**params: Unpack[...]`, so mypy and IDEs check names and types without the parameter
list being written out per method. `stream` is not among them: it chooses the return type, so each
`create` overload names it.

`declared(Params)` gives a method the signature it would have had with the parameters written out
(keyword-only, the SDK's defaults), for `inspect.signature` and `typing.get_type_hints`, and binds
each call to it: a misspelt or missing argument is the `TypeError` Python raises for any function.

No `from __future__ import annotations` here: the TypedDicts' annotations are read at runtime (which
keys are required, the types a signature shows).
"""

import functools
import inspect
from typing import Any, Callable, Dict, Iterable, List, Literal, Optional, TypeVar, Union

import httpx2
from openai import NotGiven, Omit, not_given, omit
from openai.types import ChatModel, Metadata, ReasoningEffort
from openai.types.chat import (
    ChatCompletionAudioParam,
    ChatCompletionMessageParam,
    ChatCompletionPredictionContentParam,
    ChatCompletionStreamOptionsParam,
    ChatCompletionToolChoiceOptionParam,
    ChatCompletionToolUnionParam,
    completion_create_params,
)
from typing_extensions import Required, TypedDict, get_type_hints

from ..transport._sdk import Body, Headers, Query, SequenceNotStr

__all__ = [
    "ChatCompletionCreateParams",
    "ChatCompletionParseParams",
    "CompletionCreateParams",
    "RequestOptions",
    "StreamFlag",
    "declared",
    "parameter_names",
    "required_names",
]

F = TypeVar("F", bound=Callable[..., Any])

#: `create`'s `stream` as its implementation takes it (each overload narrows it).
StreamFlag = Union[Optional[Literal[False]], Literal[True], Omit]


class RequestOptions(TypedDict, total=False):
    """The SDK's per-call request options, on every resource method."""

    extra_headers: Optional[Headers]
    extra_query: Optional[Query]
    extra_body: Optional[Body]
    timeout: Union[float, httpx2.Timeout, None, NotGiven]


class _CompletionFields(TypedDict, total=False):
    prompt: Required[Union[str, SequenceNotStr[str], Iterable[int], Iterable[Iterable[int]], None]]
    model: Optional[Union[str, Literal["gpt-3.5-turbo-instruct", "davinci-002", "babbage-002"]]]
    best_of: Optional[int] | Omit
    echo: Optional[bool] | Omit
    frequency_penalty: Optional[float] | Omit
    logit_bias: Optional[Dict[str, int]] | Omit
    logprobs: Optional[int] | Omit
    max_tokens: Optional[int] | Omit
    n: Optional[int] | Omit
    presence_penalty: Optional[float] | Omit
    seed: Optional[int] | Omit
    stop: Union[str, SequenceNotStr[str], None] | Omit
    stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit
    suffix: Optional[str] | Omit
    temperature: Optional[float] | Omit
    top_p: Optional[float] | Omit
    user: str | Omit
    # specapi's extension: Predicted Outputs on completions too (a plain string is taken as well).
    prediction: Optional[ChatCompletionPredictionContentParam] | str | Omit


class CompletionCreateParams(_CompletionFields, RequestOptions, total=False):
    """`completions.create`'s parameters but `stream`."""


class _ChatHead(TypedDict, total=False):
    messages: Required[Iterable[ChatCompletionMessageParam]]
    model: Optional[Union[str, ChatModel]]
    audio: Optional[ChatCompletionAudioParam] | Omit
    frequency_penalty: Optional[float] | Omit
    function_call: completion_create_params.FunctionCall | Omit
    functions: Iterable[completion_create_params.Function] | Omit
    logit_bias: Optional[Dict[str, int]] | Omit
    logprobs: Optional[bool] | Omit
    max_completion_tokens: Optional[int] | Omit
    max_tokens: Optional[int] | Omit
    metadata: Optional[Metadata] | Omit
    modalities: Optional[List[Literal["text", "audio"]]] | Omit
    moderation: Optional[completion_create_params.Moderation] | Omit
    n: Optional[int] | Omit
    parallel_tool_calls: bool | Omit
    prediction: Optional[ChatCompletionPredictionContentParam] | Omit
    presence_penalty: Optional[float] | Omit
    prompt_cache_key: Optional[str] | Omit
    prompt_cache_options: completion_create_params.PromptCacheOptions | Omit
    prompt_cache_retention: Optional[Literal["in_memory", "24h"]] | Omit
    reasoning_effort: Optional[ReasoningEffort] | Omit


class _ChatFormat(TypedDict, total=False):
    response_format: completion_create_params.ResponseFormat | Omit


class _ChatTail(TypedDict, total=False):
    safety_identifier: Optional[str] | Omit
    seed: Optional[int] | Omit
    service_tier: Optional[Literal["auto", "default", "flex", "scale", "priority", "fast"]] | Omit
    stop: Union[str, SequenceNotStr[str], None] | Omit
    store: Optional[bool] | Omit
    stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit
    temperature: Optional[float] | Omit
    tool_choice: ChatCompletionToolChoiceOptionParam | Omit
    tools: Iterable[ChatCompletionToolUnionParam] | Omit
    top_logprobs: Optional[int] | Omit
    top_p: Optional[float] | Omit
    user: str | Omit
    verbosity: Optional[Literal["low", "medium", "high"]] | Omit
    web_search_options: completion_create_params.WebSearchOptions | Omit


# The bases in this order keep the SDK's parameter order (`response_format` among the others), which
# is the order in which a request's unverifiable arguments are named.
class ChatCompletionCreateParams(_ChatHead, _ChatFormat, _ChatTail, RequestOptions, total=False):
    """`chat.completions.create`'s parameters but `stream`."""


class ChatCompletionParseParams(_ChatHead, _ChatTail, RequestOptions, total=False):
    """`chat.completions.parse`'s and `stream`'s parameters but `response_format` (a pydantic model there)."""


#: Defaults other than the SDK's `omit`: the target's model unless named, no extra options.
_DEFAULTS: dict[str, Any] = {"model": None, "extra_headers": None, "extra_query": None, "extra_body": None, "timeout": not_given}


@functools.lru_cache(maxsize=None)
def _parameters(params: type) -> tuple[inspect.Parameter, ...]:
    hints = get_type_hints(params)
    required = [name for name in hints if name in params.__required_keys__]  # type: ignore[attr-defined]
    keyword = inspect.Parameter.KEYWORD_ONLY
    return (
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(name, keyword, annotation=hints[name]) for name in required),
        inspect.Parameter("stream", keyword, default=omit, annotation=StreamFlag),
        *(inspect.Parameter(name, keyword, default=_DEFAULTS.get(name, omit), annotation=hints[name]) for name in hints if name not in required),
    )


def parameter_names(params: type) -> frozenset[str]:
    """The names `create` takes with the `params` declaration: its keys and `stream`."""
    return frozenset(get_type_hints(params)) | {"stream"}


def required_names(params: type) -> frozenset[str]:
    """The keys a call must give (`messages`, `prompt`)."""
    return frozenset(params.__required_keys__)  # type: ignore[attr-defined]


def declared(params: type) -> Callable[[F], F]:
    """A `create` taking `**params` that shows and checks the signature `params` declares (and `stream`).

    Each call gets the arguments it was given, in the declared order (the SDK's order, in which
    unverifiable arguments are named).
    """

    def decorate(method: F) -> F:
        signature = inspect.Signature(_parameters(params))
        order = {name: i for i, name in enumerate(signature.parameters)}
        required = required_names(params)

        @functools.wraps(method)
        def bound(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            if args or not order.keys() >= kwargs.keys() or not kwargs.keys() >= required:
                try:
                    signature.bind(self, *args, **kwargs)  # Python's own words for what is wrong
                except TypeError as exc:
                    raise TypeError(f"{method.__qualname__}() {exc}") from None
            # Sorted here, not bound: `Signature.bind` costs about 0.1 ms a call.
            return method(self, **{name: kwargs[name] for name in sorted(kwargs, key=order.__getitem__)})

        # What `inspect.signature` and `typing.get_type_hints` read (libraries inspect `create`).
        bound.__signature__ = signature  # type: ignore[attr-defined]
        bound.__annotations__ = {name: p.annotation for name, p in signature.parameters.items() if name != "self"}
        return bound  # type: ignore[return-value]

    return decorate
