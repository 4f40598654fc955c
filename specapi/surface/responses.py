"""The response objects `create` returns, assembled as the SDK's types from the engine's text or a
target's JSON, with the statistics attached (`response.speculative`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any


from ..transport._calls import RoleClient
from ..transport._exceptions import MalformedResponseError
from ..transport._sdk import construct_type
from ..engine.request import Finished
from ..core.stats import SpeculativeStats
from ..core.types import SpeculativeChatCompletion, SpeculativeCompletion

__all__ = ["build", "choice", "combined_stats", "completion_data", "response_id", "usage"]


def response_id(chat: bool) -> str:
    """A fresh id for one response, in OpenAI's shape (`chatcmpl-...` or `cmpl-...`)."""
    return f"{'chatcmpl' if chat else 'cmpl'}-spec-{os.urandom(12).hex()}"


def build(target: RoleClient, chat: bool, data: Any, stats: SpeculativeStats) -> Any:
    """The response object, built as the SDK builds it: without validating the fields (a target's
    echo puts null first in `token_logprobs`, which the SDK's types do not allow, and passes on)."""
    if not isinstance(data, Mapping):
        raise MalformedResponseError(f"response is not a JSON object: {str(data)[:200]!r}", role=target.role, endpoint=target.endpoint.label)
    cls = SpeculativeChatCompletion if chat else SpeculativeCompletion
    response = construct_type(type_=cls, value=dict(data))
    response.speculative = stats
    return response


def choice(chat: bool, text: str, finish_reason: str, *, index: int = 0, logprobs: Any = None) -> dict[str, Any]:
    """One choice of a speculated response."""
    if chat:
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def usage(*finished: Finished) -> dict[str, Any]:
    """The response's usage: the target's own when one target call wrote the answer, else the counts.
    Several choices are billed as OpenAI and vLLM bill `n`: the prompt once, every choice's tokens."""
    if len(finished) == 1 and finished[0].usage is not None:
        return dict(finished[0].usage)  # one target call wrote the answer: its usage, every field
    prompt = next((f.prompt_tokens for f in finished if f.prompt_tokens is not None), 0)
    completion = sum(f.completion_tokens for f in finished)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_data(chat: bool, model: str, answers: Sequence[tuple[str, Finished]]) -> dict[str, Any]:
    """The JSON object of a speculated, collected response: one choice per answer, in order."""
    return {
        "id": response_id(chat),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            choice(chat, text, finished.finish_reason, index=index, logprobs=finished.logprobs) for index, (text, finished) in enumerate(answers)
        ],
        "usage": usage(*(finished for _, finished in answers)),
    }


def combined_stats(stats: Sequence[SpeculativeStats]) -> SpeculativeStats:
    """The statistics of a response of several choices (`n`), each its own speculative run: rounds,
    calls and tokens added up; exact only if every choice is; the first reason of each kind given."""
    if len(stats) == 1:
        return stats[0]

    def first(values: Sequence[Any]) -> Any:
        return next((value for value in values if value is not None), None)

    speculated = [s for s in stats if s.speculated]
    ttfts = [s.ttft_s for s in stats if s.ttft_s is not None]
    return replace(
        stats[0],
        rounds=tuple(r for s in stats for r in s.rounds),
        draft=sum((s.draft for s in stats[1:]), stats[0].draft),
        target=sum((s.target for s in stats[1:]), stats[0].target),
        exact=all(s.exact for s in stats),
        exact_reason=first([s.exact_reason for s in stats]),
        speculated=bool(speculated),
        fallback_reason=first([s.fallback_reason for s in stats]),
        verification=speculated[0].verification if speculated else stats[0].verification,
        generated_tokens=sum(s.generated_tokens for s in stats),
        wall_s=max(s.wall_s for s in stats),
        ttft_s=min(ttfts) if ttfts else None,
        max_coverage_gap=max(s.max_coverage_gap for s in stats),
        discarded_draft_tokens=sum(s.discarded_draft_tokens for s in stats),
        divergent_tokens=sum(s.divergent_tokens for s in stats),
        logprob_gap=sum(s.logprob_gap for s in stats),
        load_reason=first([s.load_reason for s in stats]),
        verification_refused=first([s.verification_refused for s in stats]),
        seed_note=first([s.seed_note for s in stats]),
    )
