"""`specapi run`: one speculative generation, printed with its statistics.

With no endpoints given it runs on the embedded simulator (vLLM-like profile, LAN latencies).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from .client import AsyncSpeculativeOpenAI
from .endpoint import Endpoint

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt (completions) or user message (--chat)")
    parser.add_argument("--chat", action="store_true", help="send as a chat request")
    parser.add_argument("--target-base-url", default=os.environ.get("SPECAPI_TARGET_BASE_URL"))
    parser.add_argument("--target-model", default=os.environ.get("SPECAPI_TARGET_MODEL"))
    parser.add_argument("--target-api-key", default=os.environ.get("SPECAPI_TARGET_API_KEY"))
    parser.add_argument("--draft-base-url", default=os.environ.get("SPECAPI_DRAFT_BASE_URL"))
    parser.add_argument("--draft-model", default=os.environ.get("SPECAPI_DRAFT_MODEL"))
    parser.add_argument("--draft-api-key", default=os.environ.get("SPECAPI_DRAFT_API_KEY"))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--policy", choices=["adaptive", "fixed"], default="fixed")
    parser.add_argument("--verification", default="auto")
    parser.add_argument("--json", action="store_true", help="print the response and statistics as JSON")


async def _generate(args: argparse.Namespace) -> dict:
    if args.target_model:
        target = Endpoint(base_url=args.target_base_url, model=args.target_model, api_key=args.target_api_key)
        draft = Endpoint(base_url=args.draft_base_url, model=args.draft_model, api_key=args.draft_api_key) if args.draft_model else None
    else:
        from .sim import simulated_endpoints

        target, draft = simulated_endpoints(profile="vllm", latency="lan")
    client = AsyncSpeculativeOpenAI(
        target=target, draft=draft, num_speculative_tokens=args.num_speculative_tokens, policy=args.policy, verification=args.verification
    )
    try:
        if args.chat:
            resp = await client.chat.completions.create(
                messages=[{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
            )
            text = resp.choices[0].message.content
        else:
            resp = await client.completions.create(prompt=args.prompt, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
            text = resp.choices[0].text
    finally:
        await client.close()
    return {"text": text, "finish_reason": resp.choices[0].finish_reason, "speculative": resp.speculative.to_dict()}


def run(args: argparse.Namespace) -> int:
    from ._exceptions import SpecAPIError

    try:
        result = asyncio.run(_generate(args))
    except SpecAPIError as exc:
        print(f"specapi run: {exc}")
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    stats = result["speculative"]
    print(result["text"])
    print(
        f"\n[{result['finish_reason']}] {stats['generated_tokens']} tokens, {stats['rounds']} rounds, "
        f"acceptance {stats['acceptance_rate']:.0%}, exact={stats['exact']}, verification={stats['verification']}, "
        f"target {stats['target']['requests']} requests, draft {stats['draft']['requests']} requests, "
        f"{stats['wall_s']:.3f} s, cost {stats['cost_usd']} USD"
    )
    if stats["fallback_reason"]:
        print(f"note: {stats['fallback_reason']}")
    return 0
