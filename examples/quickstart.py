"""Quick start: speculative decoding on the embedded simulator (no keys, no network).

    python examples/quickstart.py

Swap `simulated_endpoints(...)` for your own endpoints, e.g.
    target = Endpoint(base_url="http://gpu-box:8000/v1", model="Qwen2.5-72B-Instruct")
    draft = Endpoint(base_url="http://gpu-box:8001/v1", model="Qwen2.5-0.5B-Instruct")
"""

import asyncio

from specapi import AsyncSpeculativeOpenAI
from specapi.sim import simulated_endpoints


async def main() -> None:
    # A vLLM-like server on a LAN: 30 ms to first token and 25 ms per token for the target.
    target, draft = simulated_endpoints(profile="vllm", latency="lan")
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, num_speculative_tokens=4, policy="fixed") as client:
        prompt = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        resp = await client.completions.create(prompt=prompt, max_tokens=60, temperature=0)
        print(resp.choices[0].text)
        s = resp.speculative
        print(
            f"{s.generated_tokens} tokens in {s.wall_s:.2f} s: {s.num_rounds} rounds, acceptance {s.acceptance_rate:.0%}, "
            f"{s.tokens_per_target_call:.1f} tokens per target call, exact={s.exact}, verification={s.verification}"
        )

        # The same request through the target alone, for comparison.
        baseline = AsyncSpeculativeOpenAI(target=target, verification="none")
        plain = await baseline.completions.create(prompt=prompt, max_tokens=60, temperature=0)
        print(f"target alone: {plain.speculative.wall_s:.2f} s; same text: {plain.choices[0].text == resp.choices[0].text}")

        chat = await client.chat.completions.create(
            messages=[{"role": "user", "content": "Write a Python function that reverses a list."}], max_tokens=40, temperature=0
        )
        print(chat.choices[0].message.content)
        print(f"chat: verification={chat.speculative.verification}, acceptance {chat.speculative.acceptance_rate:.0%}")


if __name__ == "__main__":
    asyncio.run(main())
