"""specapi as a LiteLLM provider: speculation for a model pair behind LiteLLM's proxy (or `litellm.acompletion`).

LiteLLM takes custom providers (`CustomLLM`, registered in `litellm_settings.custom_provider_map`). This
module's `handler` is one: a deployment whose model is `specapi/<target model>` is served by a
speculative client, its target given by the deployment's own settings (`api_base`, `api_key`) and its
draft by `draft_model`, `draft_api_base`, `draft_api_key` next to them:

    model_list:
      - model_name: qwen-72b                       # what clients ask for
        litellm_params:
          model: specapi/Qwen2.5-72B-Instruct      # the target model
          api_base: http://gpu-box:8000/v1
          api_key: os.environ/TARGET_API_KEY
          draft_model: Qwen2.5-0.5B-Instruct
          draft_api_base: http://gpu-box:8001/v1
          specapi_options: {num_speculative_tokens: 6}
    litellm_settings:
      custom_provider_map:
        - {provider: specapi, custom_handler: specapi.integrations.litellm.handler}

Chat requests go to the target's chat endpoint, `/v1/completions` requests (LiteLLM hands a custom
provider a text completion as one user message, marked `text_completion`) to its completions endpoint:
either way the answer is the target's own output. Streams are streamed.

Spend: each response says what it cost LiteLLM's spend tracking (`response_cost`: the target's and the
draft's calls together, priced by specapi: the endpoints' prices from `input_cost_per_token` /
`output_cost_per_token` and `draft_input_cost_per_token` / `draft_output_cost_per_token`, else
genai-prices), and what each role was asked for, in the request's `spend_logs_metadata` under
`"specapi"` (`target` and `draft`: requests, prompt_tokens, completion_tokens, cost_usd; and the
speculation's figures). Usage is the response's own (what the target would have billed for it alone).

Errors are LiteLLM's exception types (`litellm.RateLimitError` for an upstream 429, `NotFoundError` for
a model the target does not serve, `BadRequestError` for invalid arguments, `Timeout`, ...), which its
proxy answers with their status. `specapi_options` takes the client's options (`num_speculative_tokens`,
`policy`, `drafter`, `verification`, `pipeline`) and `share` (a Redis URL: `specapi.share`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import httpx
import litellm
from litellm import CustomLLM
from litellm.llms.custom_llm import CustomLLMError
from litellm.types.utils import GenericStreamingChunk, ModelResponse, Usage
import openai

from ..transport._exceptions import ConfigurationError, EndpointError, InvalidRequestError, UnsupportedRequestError
from ..surface.client import AsyncSpeculativeOpenAI
from ..transport.endpoint import Endpoint

__all__ = ["SpecapiLLM", "handler", "PROVIDER"]

#: The provider name config.yaml maps to `handler` (`model: specapi/<target model>`).
PROVIDER = "specapi"
#: Client options `specapi_options` may set.
_CLIENT_OPTIONS = frozenset({"num_speculative_tokens", "policy", "drafter", "verification", "pipeline"})
#: Deployment settings that are this provider's, not the request's.
_OWN_PARAMS = frozenset(
    {"draft_model", "draft_api_base", "draft_api_key", "draft_input_cost_per_token", "draft_output_cost_per_token", "specapi_options"}
)
#: What LiteLLM puts among a request's parameters that no OpenAI endpoint takes.
_NOT_FORWARDED = frozenset({"stream", "stream_options", "max_retries", "extra_headers"})


def _per_mtok(value: Any) -> Decimal | None:
    return None if value in (None, "") else Decimal(str(value)) * 1_000_000


def _settings(model: str, api_base: str | None, api_key: str | None, optional: dict[str, Any], litellm_params: dict[str, Any]) -> dict[str, Any]:
    """The client's settings from a deployment's (plain data: the cache key of its client)."""
    options = dict(optional.get("specapi_options") or {})
    unknown = set(options) - _CLIENT_OPTIONS - {"share"}
    if unknown:
        raise ConfigurationError(f"specapi_options does not take {', '.join(sorted(unknown))} (known: {', '.join(sorted(_CLIENT_OPTIONS | {'share'}))})")
    draft_model = optional.get("draft_model")
    if not draft_model:
        options.setdefault("drafter", "lookup")  # no draft model: drafts from the prompt (and the suffix index)
    return {
        "target": {
            "model": model, "base_url": api_base, "api_key": api_key,
            "input": str(litellm_params.get("input_cost_per_token") or ""), "output": str(litellm_params.get("output_cost_per_token") or ""),
        },
        "draft": None if not draft_model else {
            "model": draft_model, "base_url": optional.get("draft_api_base") or api_base, "api_key": optional.get("draft_api_key") or api_key,
            "input": str(optional.get("draft_input_cost_per_token") or ""), "output": str(optional.get("draft_output_cost_per_token") or ""),
        },
        "options": options,
        "max_retries": litellm_params.get("max_retries"),
    }


def _endpoint(spec: dict[str, Any], max_retries: Any) -> Endpoint:
    extra = {"max_retries": int(max_retries)} if isinstance(max_retries, int) and not isinstance(max_retries, bool) else {}
    return Endpoint(
        model=spec["model"], base_url=spec["base_url"], api_key=spec["api_key"] or "EMPTY",
        input_price_per_mtok=_per_mtok(spec["input"]), output_price_per_mtok=_per_mtok(spec["output"]), **extra,
    )


def _role(usage: Any) -> dict[str, Any]:
    cost = usage.cost_usd
    return {
        "requests": usage.requests, "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
        "cost_usd": None if cost is None else str(cost),
    }


def _summary(stats: Any) -> dict[str, Any]:
    """What the spend log keeps of one response: per role, and the speculation's figures."""
    return {
        "target": _role(stats.target), "draft": _role(stats.draft),
        "cost_usd": None if stats.cost_usd is None else str(stats.cost_usd),
        "speculated": stats.speculated, "exact": stats.exact, "verification": stats.verification,
        "drafted_tokens": stats.drafted_tokens, "accepted_tokens": stats.accepted_tokens, "num_rounds": stats.num_rounds,
    }


def _record_spend(stats: Any, logging_obj: Any, litellm_params: dict[str, Any] | None) -> float | None:
    """Put the per-role figures in the request's `spend_logs_metadata`; the cost for `response_cost`."""
    summary = _summary(stats)
    details = getattr(logging_obj, "model_call_details", None)
    for params in (litellm_params, details.get("litellm_params") if isinstance(details, dict) else None):
        if isinstance(params, dict):
            metadata = params.get("metadata")
            if not isinstance(metadata, dict):
                metadata = params["metadata"] = {}
            spend = metadata.get("spend_logs_metadata")
            metadata["spend_logs_metadata"] = {**(spend if isinstance(spend, dict) else {}), "specapi": summary}
    cost = None if stats.cost_usd is None else float(stats.cost_usd)
    if cost is not None and isinstance(details, dict):
        details["response_cost"] = cost
    return cost


def _status_response(status: int, url: str | None) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("POST", url or "http://specapi"))


def litellm_error(exc: BaseException, model: str, api_base: str | None = None) -> Exception:
    """`exc` (specapi's, or the SDK's it wraps) as the LiteLLM exception of the same kind."""
    message = str(exc)
    provider = PROVIDER
    status = getattr(exc, "status_code", None)
    if isinstance(exc, (InvalidRequestError, ConfigurationError, UnsupportedRequestError, TypeError)):
        return litellm.BadRequestError(message=message, model=model, llm_provider=provider)
    if isinstance(exc, openai.APITimeoutError):
        return litellm.Timeout(message=message, model=model, llm_provider=provider)
    if isinstance(exc, openai.APIConnectionError):
        return litellm.APIConnectionError(message=message, llm_provider=provider, model=model)
    if status == 429:
        return litellm.RateLimitError(message=message, llm_provider=provider, model=model, response=_status_response(429, api_base))
    if status == 400:
        return litellm.BadRequestError(message=message, model=model, llm_provider=provider)
    if status == 401:
        return litellm.AuthenticationError(message=message, llm_provider=provider, model=model)
    if status == 403:
        return litellm.PermissionDeniedError(message=message, llm_provider=provider, model=model, response=_status_response(403, api_base))
    if status == 404:
        return litellm.NotFoundError(message=message, model=model, llm_provider=provider)
    if status == 422:
        return litellm.UnprocessableEntityError(message=message, model=model, llm_provider=provider, response=_status_response(422, api_base))
    if status == 503:
        return litellm.ServiceUnavailableError(message=message, llm_provider=provider, model=model)
    if isinstance(exc, EndpointError) and status is None:
        return litellm.APIConnectionError(message=message, llm_provider=provider, model=model)
    return litellm.InternalServerError(message=message, llm_provider=provider, model=model)


def _text_prompt(messages: list[dict[str, Any]], litellm_params: dict[str, Any] | None) -> str | None:
    """The prompt of a text completion LiteLLM handed over as chat (one user message), else None."""
    if not (litellm_params or {}).get("text_completion") or len(messages) != 1:
        return None
    content = messages[0].get("content")
    return content if messages[0].get("role") == "user" and isinstance(content, str) else None


class SpecapiLLM(CustomLLM):
    """The LiteLLM provider: one speculative client per deployment (target, draft, options) and event loop."""

    def __init__(self) -> None:
        super().__init__()
        self._clients: dict[tuple[int, str], AsyncSpeculativeOpenAI] = {}
        self._shares: list[Any] = []

    async def _client(self, settings: dict[str, Any]) -> AsyncSpeculativeOpenAI:
        key = (id(asyncio.get_running_loop()), json.dumps(settings, sort_keys=True))
        client = self._clients.get(key)
        if client is None:
            options = dict(settings["options"])
            share_url = options.pop("share", None)
            draft = settings["draft"]
            client = AsyncSpeculativeOpenAI(
                target=_endpoint(settings["target"], settings["max_retries"]),
                draft=None if draft is None else _endpoint(draft, settings["max_retries"]),
                **options,
            )
            if share_url:
                from ..share import RedisShare

                share = RedisShare(share_url)
                await share.attach(client)
                self._shares.append(share)
            self._clients[key] = client
        return client

    async def _prepare(
        self, model: str, messages: list, api_base: str | None, api_key: str | None, optional_params: dict, litellm_params: dict | None
    ) -> tuple[AsyncSpeculativeOpenAI, Callable[..., Any], dict[str, Any]]:
        optional = dict(optional_params or {})
        client = await self._client(_settings(model, api_base, api_key, optional, litellm_params or {}))
        arguments = {k: v for k, v in optional.items() if k not in _OWN_PARAMS and k not in _NOT_FORWARDED}
        prompt = _text_prompt(messages, litellm_params)
        if prompt is not None:
            return client, client.completions.create, {"model": model, "prompt": prompt, **arguments}
        return client, client.chat.completions.create, {"model": model, "messages": messages, **arguments}

    async def acompletion(  # type: ignore[override]
        self, model: str, messages: list, api_base: str, custom_prompt_dict: dict, model_response: ModelResponse, print_verbose: Callable,
        encoding: Any, api_key: Any, logging_obj: Any, optional_params: dict, acompletion: Any = None, litellm_params: Any = None,
        logger_fn: Any = None, headers: dict | None = None, timeout: Any = None, client: Any = None,
    ) -> ModelResponse:
        try:
            _, create, arguments = await self._prepare(model, messages, api_base, api_key, optional_params, litellm_params)
            result = await create(**arguments)
        except Exception as exc:
            raise litellm_error(exc, model, api_base) from exc
        choice = result.choices[0]
        text = choice.message.content if hasattr(choice, "message") else choice.text
        model_response.choices[0].message.content = text  # type: ignore[union-attr]
        model_response.choices[0].finish_reason = choice.finish_reason or "stop"
        model_response.created = int(time.time())
        model_response.model = model
        if result.usage is not None:
            usage = Usage(prompt_tokens=result.usage.prompt_tokens, completion_tokens=result.usage.completion_tokens,
                          total_tokens=result.usage.prompt_tokens + result.usage.completion_tokens)
            setattr(model_response, "usage", usage)
        cost = _record_spend(result.speculative, logging_obj, litellm_params)
        model_response._hidden_params["specapi"] = _summary(result.speculative)
        if cost is not None and _text_prompt(messages, litellm_params) is None:
            # Chat: LiteLLM takes a response's own cost from its hidden params. A text completion is
            # converted from this response with hidden params of a fixed shape, whose empty cost would
            # win over the one `_record_spend` gave the logging object (LiteLLM 1.108, measured).
            model_response._hidden_params["response_cost"] = cost
        return model_response

    async def astreaming(  # type: ignore[override]
        self, model: str, messages: list, api_base: str, custom_prompt_dict: dict, model_response: ModelResponse, print_verbose: Callable,
        encoding: Any, api_key: Any, logging_obj: Any, optional_params: dict, acompletion: Any = None, litellm_params: Any = None,
        logger_fn: Any = None, headers: dict | None = None, timeout: Any = None, client: Any = None,
    ) -> AsyncIterator[GenericStreamingChunk]:
        try:
            _, create, arguments = await self._prepare(model, messages, api_base, api_key, optional_params, litellm_params)
            # The last chunk then carries the response's usage (prompt tokens too).
            stream = await create(**arguments, stream=True, stream_options={"include_usage": True})
        except Exception as exc:
            raise litellm_error(exc, model, api_base) from exc
        finish_reason: str | None = None
        usage: Any = None
        try:
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    delta = getattr(choice, "delta", None)
                    text = (delta.content if delta is not None else choice.text) or ""
                    finish_reason = choice.finish_reason or finish_reason
                    if text:
                        yield GenericStreamingChunk(text=text, is_finished=False, finish_reason="", usage=None, index=0, tool_use=None)
        except Exception as exc:
            raise litellm_error(exc, model, api_base) from exc
        finally:
            await stream.close()
        stats = stream.speculative
        if usage is None and stats is not None:  # a server that sends no usage in streams: the target's output
            usage = type("U", (), {"prompt_tokens": 0, "completion_tokens": stats.generated_tokens})()
        block = None
        if usage is not None:
            block = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                     "total_tokens": usage.prompt_tokens + usage.completion_tokens}
        if stats is not None:
            cost = _record_spend(stats, logging_obj, litellm_params)
            if block is not None and cost is not None:
                # A streamed usage's `cost` is what LiteLLM's stream builder records as the response's cost.
                block["cost"] = cost
        yield GenericStreamingChunk(text="", is_finished=True, finish_reason=finish_reason or "stop", usage=block, index=0, tool_use=None)  # type: ignore[typeddict-item]

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        raise CustomLLMError(status_code=400, message=_ASYNC_ONLY)

    def streaming(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise CustomLLMError(status_code=400, message=_ASYNC_ONLY)


#: The speculative client's connections live on one event loop: LiteLLM's async API (its proxy's) serves it.
_ASYNC_ONLY = "specapi runs through LiteLLM's async API (litellm.acompletion / atext_completion, or its proxy)"


#: The instance config.yaml names: `custom_handler: specapi.integrations.litellm.handler`.
handler = SpecapiLLM()
