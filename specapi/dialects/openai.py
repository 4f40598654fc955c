"""The two OpenAI formats every server speaks: chat (`/chat/completions`) and legacy completions
(`/completions`), and every request body specapi sends in them.

One object per format owns where a request goes, how the prompt and the text so far are put in its
body, and how text, streamed text and logprobs are read back; the request builders below take typed
inputs (the context, the sampling, counts) and return `(path, body)`, so the verifiers, drafters,
fan-out, whole-answer paths and the probe ask here instead of naming wire fields or branching on chat.

How each family spells what a body asks (docs/verification.md, providers.md):
- completions: `prompt`, `max_tokens`, `logprobs` as the list length (OpenAI's legacy endpoint takes up
  to 5, vLLM up to its `--max-logprobs`), `echo` to score the prompt too (vLLM, SGLang, Together, OpenAI
  base models; llama-server refuses it).
- chat: `messages`, `logprobs: true` and `top_logprobs` (up to 20) for the list; continuing a final
  assistant message takes vLLM's and SGLang's `continue_final_message: true` with
  `add_generation_prompt: false`, while llama-server continues one by itself and repeats the prefix.
- both: `temperature`, `top_p`, `seed`, `stop`, `stream_options: {include_usage: true}` for a streamed
  bill, and OpenAI's Predicted Outputs as `prediction: {type: "content", content}` (chat).
vLLM's own extras (`prompt_logprobs`, `return_token_ids`) are in `dialects/vllm.py`.

`openai_format(context)` gives the format of a request: chat when it has messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.alignment import ScoredToken
from ..core.context import Context
from .logprobs import caller_fields, chat_tokens, completion_tokens

__all__ = [
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "CONTINUE_FINAL_MESSAGE",
    "OPENAI_LIST_CAP",
    "TRAILING",
    "ChatFormat",
    "CompletionsFormat",
    "DraftShape",
    "OpenAIFormat",
    "Prefill",
    "chat_request",
    "completion_request",
    "fixed_sampling",
    "format_of",
    "generation_request",
    "next_token_request",
    "openai_format",
    "prediction_fields",
    "sampling_fields",
    "shorter_lists",
]

#: The parameters of the SDK's `completions.create` (the proxy passes these on, refuses the rest).
COMPLETION_FIELDS = frozenset(
    {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
     "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user"}
)  # fmt: skip
#: The parameters of the SDK's `chat.completions.create`.
CHAT_FIELDS = frozenset(
    {"model", "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
     "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
     "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
     "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
     "top_logprobs", "top_p", "user", "verbosity", "web_search_options"}
)  # fmt: skip

#: Prefill styles: vLLM's and SGLang's flags, or a server that continues a final assistant message by itself.
CONTINUE_FINAL_MESSAGE = "continue_final_message"
TRAILING = "trailing"


@dataclass(frozen=True)
class Prefill:
    """How an endpoint continues a partial assistant message.

    `style` CONTINUE_FINAL_MESSAGE sends vLLM/SGLang's flags (`continue_final_message: true`,
    `add_generation_prompt: false`); TRAILING relies on the server continuing a final assistant
    message by itself (llama.cpp). `echoes_prefix`: the reply's content repeats the prefix (llama-server).
    """

    style: str = CONTINUE_FINAL_MESSAGE
    echoes_prefix: bool = False

    @property
    def flags(self) -> bool:
        """It sends vLLM/SGLang's flags (an endpoint that refuses them continues without: TRAILING)."""
        return self.style == CONTINUE_FINAL_MESSAGE

    def fields(self, has_prefix: bool) -> dict[str, Any]:
        if has_prefix and self.flags:
            return {CONTINUE_FINAL_MESSAGE: True, "add_generation_prompt": False}
        return {}

    def strip(self, content: str, prefix: str) -> str:
        """The continuation alone. None of it is trusted if an echoing server did not echo."""
        if self.echoes_prefix and prefix:
            if not content.startswith(prefix):
                raise ValueError("the reply does not repeat the continued prefix")
            return content[len(prefix) :]
        return content


def fixed_sampling(temperature: float, seed: int | None = None) -> dict[str, Any]:
    """Sampling fields of specapi's own requests (the probe's), not a caller's."""
    return {"temperature": temperature} if seed is None else {"temperature": temperature, "seed": seed}


def sampling_fields(context: Context, seed: int | None, *, target: bool = True) -> dict[str, Any]:
    """The sampling fields of a request: the target also gets every extra field of the caller's
    request; the draft (another server, maybe of another kind) only temperature, top_p and seed."""
    body: dict[str, Any] = dict(context.extras) if target else {}
    if not target and context.sampling.point_mass_draft:
        body["temperature"] = 0.0  # the draft's most likely tokens (see SamplingParams.point_mass_draft)
    else:
        body["temperature"] = context.sampling.temperature
        if context.sampling.top_p < 1.0:
            body["top_p"] = context.sampling.top_p
    if seed is not None:
        body["seed"] = seed
    return body


@dataclass(frozen=True)
class ChatFormat:
    """`/chat/completions`: the text so far is a final assistant message the server continues."""

    path: str = "/chat/completions"
    chat: bool = True

    def prompt_fields(self, context: Context, extra: str = "", prefill: Prefill = Prefill()) -> dict[str, Any]:
        return {"messages": context.chat_messages(extra), **prefill.fields(bool(context.accepted or extra))}

    def text(self, choice: Mapping[str, Any], prefix: str = "", prefill: Prefill = Prefill()) -> str:
        """The generated text alone (a server that repeats the continued prefix has it cut off)."""
        content = (choice.get("message") or {}).get("content") or ""
        if not isinstance(content, str):
            raise TypeError("message.content is not a string")
        return prefill.strip(content, prefix)

    def delta(self, choice: Mapping[str, Any]) -> str:
        return (choice.get("delta") or {}).get("content") or ""

    def tokens(self, choice: Mapping[str, Any]) -> list[ScoredToken]:
        return chat_tokens((choice.get("logprobs") or {}).get("content"))

    def logprobs(self, top_k: int | None = None) -> dict[str, Any]:
        """Fields asking for the generated tokens' logprobs (and `top_k` alternatives, up to 20)."""
        return {"logprobs": True} if top_k is None else {"logprobs": True, "top_logprobs": min(top_k, 20)}

    #: The field holding the length of the alternatives' list (lowered when a server refuses it).
    list_field: str = "top_logprobs"

    def draft_fields(self, context: Context, top_k: int, prefill: Prefill = Prefill()) -> dict[str, Any]:
        """A draft request's prompt and logprob fields, `top_k` alternatives (uncapped: the caller lowers
        it on a refusal). A completions request drafted by chat continues its prompt as an assistant message."""
        if context.is_chat:
            fields = self.prompt_fields(context, prefill=prefill)
        else:
            fields = {"messages": [{"role": "assistant", "content": context.completion_prompt()}], **prefill.fields(True)}
        return {**fields, "logprobs": True, self.list_field: top_k}


@dataclass(frozen=True)
class CompletionsFormat:
    """`/completions`: the text so far is appended to the prompt."""

    path: str = "/completions"
    chat: bool = False

    def prompt_fields(self, context: Context, extra: str = "", prefill: Prefill = Prefill()) -> dict[str, Any]:
        return {"prompt": context.completion_prompt(extra)}

    def text(self, choice: Mapping[str, Any], prefix: str = "", prefill: Prefill = Prefill()) -> str:
        text = choice.get("text") or ""
        if not isinstance(text, str):
            raise TypeError("text is not a string")
        return text

    def delta(self, choice: Mapping[str, Any]) -> str:
        return choice.get("text") or ""

    def tokens(self, choice: Mapping[str, Any]) -> list[ScoredToken]:
        return completion_tokens(choice.get("logprobs"))

    def logprobs(self, top_k: int | None = None) -> dict[str, Any]:
        """`logprobs` is the list length here (OpenAI's legacy endpoint takes up to 5)."""
        return {"logprobs": 1 if top_k is None else min(top_k, 5)}

    list_field: str = "logprobs"

    def draft_fields(self, context: Context, top_k: int, prefill: Prefill = Prefill()) -> dict[str, Any]:
        """A draft request's prompt and logprob fields (`top_k` uncapped: vLLM takes 20, OpenAI 5)."""
        return {**self.prompt_fields(context), self.list_field: top_k}


OpenAIFormat = ChatFormat | CompletionsFormat

_CHAT, _COMPLETIONS = ChatFormat(), CompletionsFormat()


def format_of(chat: bool) -> OpenAIFormat:
    """The chat format, or the completions one."""
    return _CHAT if chat else _COMPLETIONS


def openai_format(context: Context) -> OpenAIFormat:
    """The format of a request: chat when it has messages (`Context.is_chat`)."""
    return format_of(context.is_chat)


def generation_request(
    context: Context,
    max_tokens: int | None,
    seed: int | None,
    stop: tuple[str, ...],
    prefill: Prefill = Prefill(),
    *,
    count_tokens: bool = False,
    stream_usage: bool = False,
    prediction: str | None = None,
) -> tuple[str, dict]:
    """The path and body of a request in which the target generates from the context by itself
    (`max_tokens` None: none is sent, and the server's own limit applies). `count_tokens` asks the
    generated tokens' logprobs (to count them exactly); `stream_usage` the bill at a stream's end;
    `prediction` (not empty) goes as Predicted Outputs."""
    form = openai_format(context)
    body: dict = {**sampling_fields(context, seed)}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stop:
        body["stop"] = list(stop)  # the wire's form: a list
    body.update(form.prompt_fields(context, prefill=prefill))
    if count_tokens:
        body.update(form.logprobs())
    if context.logprobs is not None:
        body.update(caller_fields(form.chat, context.logprobs))  # the caller's own, as the target alone gets them
    if stream_usage:
        body["stream_options"] = {"include_usage": True}
    if prediction:
        body.update(prediction_fields(prediction))
    return form.path, body


def prediction_fields(text: str) -> dict[str, Any]:
    """OpenAI's Predicted Outputs: the text the answer is expected to hold."""
    return {"prediction": {"type": "content", "content": text}}


def completion_request(
    prompt: str, max_tokens: int, sampling: Mapping[str, Any] | None = None, *, top_k: int | None = None, echo: bool = False
) -> tuple[str, dict]:
    """A completions request: `top_k` alternatives per token (sent as is: the caller knows the
    endpoint's cap), `echo` to score the prompt's tokens too (echo verification, the probe)."""
    body: dict[str, Any] = {"prompt": prompt}
    if echo:
        body["echo"] = True
    if top_k is not None:
        body["logprobs"] = top_k
    body["max_tokens"] = max_tokens
    body.update(sampling or {})
    return _COMPLETIONS.path, body


def chat_request(
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int,
    sampling: Mapping[str, Any] | None = None,
    *,
    top_k: int | None = None,
    prefill: Prefill | None = None,
    prediction: str | None = None,
) -> tuple[str, dict]:
    """A chat request: `top_k` alternatives per token (up to 20), `prefill` to continue the final
    assistant message in that style, `prediction` as Predicted Outputs."""
    body: dict[str, Any] = {"messages": list(messages), "max_tokens": max_tokens}
    if top_k is not None:
        body.update(_CHAT.logprobs(top_k))
    body.update(sampling or {})
    if prefill is not None:
        body.update(prefill.fields(True))
    if prediction is not None:
        body.update(prediction_fields(prediction))
    return _CHAT.path, body


def next_token_request(context: Context, prefix: str, top_k: int, seed: int | None, prefill: Prefill = Prefill()) -> tuple[str, dict]:
    """One token after the context and `prefix`, with `top_k` alternatives (prefill fan-out)."""
    form = openai_format(context)
    body = {"max_tokens": 1, **sampling_fields(context, seed), **form.prompt_fields(context, prefix, prefill), **form.logprobs(top_k)}
    return form.path, body


#: The longest list OpenAI's legacy completions take (`logprobs` up to 5): a draft asking more of an
#: endpoint that refuses it asks this much from then on.
OPENAI_LIST_CAP = 5


@dataclass(frozen=True)
class DraftShape:
    """What a draft model's endpoint was found to take, learnt from its refusals: completions (else
    chat only: a chat-only model), and how it continues a final assistant message."""

    completions: bool = True
    prefill: Prefill = Prefill()

    def request(self, context: Context, k: int, top_k: int, seed: int | None) -> tuple[OpenAIFormat, dict]:
        """A request for up to `k` tokens with `top_k` alternatives each (uncapped: see `shorter_lists`),
        in the request's own format, or chat where completions were refused (the draft is only a
        proposal, so any proposal distribution with known probabilities keeps the output exact). A
        completions request drafted by chat continues its prompt as an assistant message."""
        form = openai_format(context) if self.completions else _CHAT
        body = {**form.draft_fields(context, top_k, self.prefill), "max_tokens": k, **sampling_fields(context, seed, target=False)}
        return form, body

    def after_refusal(self, form: OpenAIFormat, *, refused_shape: bool, not_served: bool) -> DraftShape | None:
        """What to send instead after `form`'s request was refused; None when nothing is left to try."""
        if form.chat and refused_shape and self.prefill.flags:
            return replace(self, prefill=Prefill(style=TRAILING))  # it continues a final assistant message by itself
        if not form.chat and (refused_shape or not_served):
            return replace(self, completions=False)  # e.g. a chat-only model: chat from now on
        return None


def shorter_lists(form: OpenAIFormat, body: Mapping[str, Any], cap: int = OPENAI_LIST_CAP) -> dict | None:
    """The body with lists of at most `cap` alternatives; None when its lists are no longer."""
    if body[form.list_field] <= cap:
        return None
    return {**body, form.list_field: cap}
