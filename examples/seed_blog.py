"""The blog experiment specapi started from, three ways side by side (see specapi/bench/blog.py).

    python examples/seed_blog.py                 # the embedded simulator's hosted OpenAI-like pair, no keys
    python examples/seed_blog.py --base-url https://api.openai.com/v1 --api-key sk-... \\
        --target-model gpt-4o --draft-model gpt-4o-mini

The question `解释一下 Transformer 的注意力机制，用类比说明`, the draft writing 4 tokens per round at
temperature 0.7, 60 tokens: the blog's own algorithm (written from its description), the target alone,
and specapi (its defaults, and `prediction=` with an earlier answer). For each: wall time, time to
first token, billed tokens per role, cost (genai-prices), acceptance, and whether the text is the
target's own, checked at the blog's temperature and greedy. Then the lossy acceptance sweep (the
blog's unused threshold made real): speedup against divergence, on a LAN vLLM-like pair where the
target shows its probabilities (with --base-url: on your endpoints, if they do).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from specapi import Endpoint
from specapi.bench.blog import SHORT_SWEEP, SIM_PRICE_MODELS, SWEEP, SWEEP_PROMPTS, format_sweep, format_table, lossy_sweep, seed_blog
from specapi.sim import simulated_endpoints


async def main(args: argparse.Namespace) -> dict:
    if args.base_url or args.target_model:
        target = Endpoint(base_url=args.base_url, api_key=args.api_key, model=args.target_model or "gpt-4o")
        draft = Endpoint(base_url=args.base_url, api_key=args.api_key, model=args.draft_model or "gpt-4o-mini")
        where, prices, check, sweep_pair = f"{target.label} and {draft.label}", None, None, (target, draft)
    else:
        target, draft = simulated_endpoints(profile="openai", latency=args.latency)
        check = simulated_endpoints(profile="openai", latency="instant")  # the greedy check: only text matters
        sweep_pair = simulated_endpoints(profile="vllm", latency="lan" if args.latency != "instant" else "instant")
        where, prices = f"the simulator's hosted OpenAI-like pair ({args.latency} latency), priced as gpt-4o / gpt-4o-mini", SIM_PRICE_MODELS
    print(f"specapi seed-blog: {where}", file=sys.stderr)
    result = await seed_blog(target, draft, price_models=prices, greedy_check=check)
    print(format_table(result))
    print()
    if not args.no_sweep:
        if args.full_sweep:
            sweep = await lossy_sweep(*sweep_pair, settings=SWEEP)
        else:  # the blog's question and one code request, 40 tokens: within the minute
            sweep = await lossy_sweep(*sweep_pair, settings=SHORT_SWEEP, prompts=SWEEP_PROMPTS[::2], max_tokens=40)
        result["sweep"] = sweep
        print(format_sweep(sweep))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, ensure_ascii=False, indent=2)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-format base URL serving both models (default: the simulator)")
    parser.add_argument("--api-key", help="its API key (or OPENAI_API_KEY)")
    parser.add_argument("--target-model", help="the target model (default gpt-4o with --base-url)")
    parser.add_argument("--draft-model", help="the draft model (default gpt-4o-mini with --base-url)")
    parser.add_argument("--latency", default="hosted", choices=("hosted", "instant"), help="the simulator's latency profile")
    parser.add_argument("--full-sweep", action="store_true", help="all eight acceptance settings on four requests of 60 tokens (takes longer than a minute)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the lossy acceptance sweep")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    asyncio.run(main(parser.parse_args()))
