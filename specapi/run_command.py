"""`specapi run`: one speculative generation; the text on stdout, its statistics on stderr.

With no `--target-model` it runs on the embedded simulator (vLLM-like profile, LAN latencies).
`--json` prints `{"text", "finish_reason", "speculative"}` on stdout instead, where `"speculative"` is
`SpeculativeStats.to_dict(rounds=True)`: the same names as the Python statistics, the proxy's
`"speculative"` field and the bench's JSON. Exit codes: 0 done, 1 an endpoint failed, 2 bad options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from .core.cli_options import (
    ENDPOINTS,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Option,
    UsageError,
    acceptance_options,
    acceptance_values,
    add_options,
    boolean,
    refuse_hosted,
    resolve,
    speculation_options,
)

__all__ = ["add_arguments", "run", "OPTIONS"]


def _temperature(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 2.0:
        raise ValueError("must be in [0, 2]")
    return value


REQUEST: tuple[Option, ...] = (
    Option("--chat", "SPECAPI_CHAT", boolean, False, "send the prompt as a chat user message (else a completions prompt)"),
    Option("--max-tokens", "SPECAPI_MAX_TOKENS", int, 64, "tokens to generate at most"),
    Option("--temperature", "SPECAPI_TEMPERATURE", _temperature, 0.0, "sampling temperature (0 = greedy)"),
    Option("--seed", "SPECAPI_SEED", int, None, "seed for sampled requests", default_text="none"),
    Option("--json", "SPECAPI_JSON", boolean, False, "print the text and statistics as one JSON object on stdout"),
)
OPTIONS: tuple[Option, ...] = (*ENDPOINTS, *speculation_options(), *acceptance_options(), *REQUEST)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt (completions) or user message (--chat)")
    add_options(parser.add_argument_group("endpoints (default: the embedded simulator)"), ENDPOINTS)
    add_options(parser.add_argument_group("speculation"), speculation_options())
    add_options(parser.add_argument_group("acceptance (lossy rules are opt-in)"), acceptance_options())
    add_options(parser.add_argument_group("request and output"), REQUEST)


async def _generate(prompt: str, values: Mapping[str, Any]) -> dict[str, Any]:
    from .surface.client import AsyncSpeculativeOpenAI
    from .transport.endpoint import Endpoint

    if values["target_model"]:
        target = Endpoint(base_url=values["target_base_url"], model=values["target_model"], api_key=values["target_api_key"])
        draft = None
        if values["draft_model"]:
            draft = Endpoint(base_url=values["draft_base_url"], model=values["draft_model"], api_key=values["draft_api_key"])
    else:
        from .sim import simulated_endpoints

        print("specapi run: no --target-model, running on the embedded simulator (models sim-target, sim-draft)", file=sys.stderr)
        target, draft = simulated_endpoints(profile="vllm", latency="lan")
    client = AsyncSpeculativeOpenAI(
        target=target,
        draft=draft,
        num_speculative_tokens=values["num_speculative_tokens"],
        policy=values["policy"],
        drafter=values["drafter"],
        verification=values["verification"],
        pipeline=values["pipeline"],
        **acceptance_values(values),
    )
    request = {"max_tokens": values["max_tokens"], "temperature": values["temperature"], "seed": values["seed"]}
    try:
        if values["chat"]:
            chat = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **request)
            text, finish, stats = chat.choices[0].message.content or "", chat.choices[0].finish_reason, chat.speculative
        else:
            completion = await client.completions.create(prompt=prompt, **request)
            text, finish, stats = completion.choices[0].text, completion.choices[0].finish_reason, completion.speculative
    finally:
        await client.close()
    assert stats is not None
    return {"text": text, "finish_reason": finish, "speculative": stats, "summary": stats.summary()}


def run(args: argparse.Namespace) -> int:
    from .transport._exceptions import ConfigurationError, SpecAPIError

    try:
        values = resolve(args, OPTIONS, os.environ)
        refuse_hosted(values, os.environ)
        if values["drafter"] == "model" and not values["draft_model"] and values["target_model"]:
            raise UsageError("--drafter model needs --draft-model")
        result = asyncio.run(_generate(args.prompt, values))
    except (UsageError, ConfigurationError) as exc:
        print(f"specapi run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SpecAPIError as exc:
        print(f"specapi run: {exc}", file=sys.stderr)
        return EXIT_FAILED
    stats = result["speculative"]
    if values["json"]:
        payload = {"text": result["text"], "finish_reason": result["finish_reason"], "speculative": stats.to_dict(rounds=True)}
        print(json.dumps(payload, indent=2))
        return EXIT_OK
    print(result["text"])
    print(f"[{result['finish_reason']}] {result['summary']}", file=sys.stderr)
    return EXIT_OK
