"""CPU the suffix index costs a request on long texts: per round (the suffix drafter's query), at the
request's start (the free-draft gate's), and at its end (learning the request).

Each is mostly tokenizing (tiktoken) and inserting tokens; on short prompts they are microseconds,
on the long prompts of agents and retrieval they were a large part of what a round costs. No network,
no servers: the functions are called in this process, `--repeat` times each, and the mean is printed.

    python benchmarks/suffix_cost.py
    python benchmarks/suffix_cost.py --chars 8000 --repeat 500
"""

from __future__ import annotations

import argparse
import asyncio
import time

from specapi.transport._calls import Meter
from specapi.core.context import Context
from specapi.transport.endpoint import Endpoint
from specapi.parts.suffix import SuffixDrafter, SuffixIndex, expected_continuation, learn


def texts(chars: int) -> dict[str, tuple[str, str]]:
    """Long prompts (not one block repeated) and an answer for each."""
    code = "".join(f"def handle_{i}(request):\n    user = request.users[{i * 7}]\n    return render(request, 'p{i}.html')\n" for i in range(chars // 60))
    chinese = "".join(f"第{i}条：推测解码在第{i * 3}轮接受了{i % 7}个词元，目标模型验证草稿。" for i in range(chars // 30))
    return {
        "code": (code[-chars:], "    logger.info('handled %s', user.id)\n    return response\n"),
        "chinese": (chinese[-chars:], "推测解码是一种加速方法，目标模型的输出不变。"),
    }


def _mean_us(call, repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        call()
    return (time.process_time() - started) / repeat * 1e6


async def main(args: argparse.Namespace) -> None:
    meter = Meter(Endpoint(base_url="http://unused/v1", model="m"))
    print(f"{'text':10} {'chars':>6} {'per round':>10} {'at start':>10} {'at end':>10}   (microseconds of CPU, mean of {args.repeat})")
    for name, (prompt, answer) in texts(args.chars).items():
        index = SuffixIndex()
        start = Context(prompt=prompt)
        learn(index, start, answer)
        drafter = SuffixDrafter(index)
        midway = start.advanced(answer[: len(answer) // 3])

        def one_round() -> None:
            coroutine = drafter.draft(midway, 8, meter, None)
            try:
                coroutine.send(None)  # the drafter makes no call: it finishes at its first step
            except StopIteration:
                pass

        per_round = _mean_us(one_round, args.repeat)
        at_start = _mean_us(lambda: expected_continuation(index, start, 8), args.repeat)
        at_end = _mean_us(lambda: learn(SuffixIndex(), start, answer), args.repeat)
        print(f"{name:10} {len(prompt):>6} {per_round:>10.0f} {at_start:>10.0f} {at_end:>10.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=4000, help="characters of each prompt (default 4000)")
    parser.add_argument("--repeat", type=int, default=300)
    asyncio.run(main(parser.parse_args()))
