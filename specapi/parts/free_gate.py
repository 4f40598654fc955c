"""The free-draft gate: per request, lets a request the suffix index knows speculate with free drafts
(no draft call: the index, the prompt) where the client's policy would otherwise let the target
generate alone, or step aside for the load. `gate_free_drafts` wraps a request's drafter and policy.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.context import Context
from .draft_length import SPECULATE, TARGET_ALONE, Decision, PolicyBase, Start, as_policy
from .drafters import CombinedDrafter
from .suffix import SuffixIndex, expected_continuation

__all__ = ["FreeDraftGate", "gate_free_drafts"]

#: The remaining tokens a request without max_tokens is judged by (the engine's budget for it).
_NO_LIMIT = 1 << 20
_FREE_UNTIL_DRY = "suffix index: free drafts until none was proposed, then the target alone"


class FreeDraftGate(PolicyBase):
    """One request's draft-length policy around the client's own: free drafts where it would not speculate.

    When the client's policy would let the target generate this request alone (it measured that the
    draft model does not pay), but the suffix index expects to continue the request's text for at least
    `min_tokens` tokens, and by the policy's measured call costs (`free_drafts_pay`) rounds of such
    drafts beat the target alone on the request's `remaining` tokens, the request speculates with the free drafters only (`free_drafters()` is
    called: no draft-model calls) at `max_length` tokens per round; the first round where no free
    drafter proposes anything hands the rest to the target alone. Everything is also passed to the
    client's policy, which keeps learning.

    While speculation is on, the same expectation sizes the request's first round: it is drafted by the
    free drafters alone, as long as the index expects to go on (the policy sizes rounds for the draft
    model); later rounds draft as the policy and the combined drafter choose.
    """

    def __init__(
        self, inner: Any, expected: float, free_drafters: Any, *, max_length: int, remaining: int | None, min_tokens: float = 4.0
    ) -> None:
        self.inner = inner
        self._policy = as_policy(inner)  # with every member of `DraftLengthPolicy`
        # No limit set (the server's own applies): judged as a long request, as the engine budgets it.
        self.remaining = remaining if remaining is not None else _NO_LIMIT
        self.name = self._policy.name
        self.expected = expected
        self.free_drafters = free_drafters
        self.max_length = max_length
        self.min_tokens = min_tokens
        self.free = False
        self._dry = False
        self._first_round_free = False  # the first round is drafted free (see `choose`)

    @property
    def watches_queue(self) -> bool:  # type: ignore[override]
        return self._policy.watches_queue

    @property
    def free_max_length(self) -> int:  # type: ignore[override]
        return self.max_length

    def start_request(self) -> Start:
        started = self._policy.start_request()
        if started.mode == TARGET_ALONE and self._pays():
            self.free = True
            self.free_drafters()
            return Start(SPECULATE)
        return started

    def _pays(self) -> bool:
        """Free rounds beat the target alone, by the client policy's measured costs (if it has them)."""
        if self.expected < self.min_tokens:
            return False
        verdict = self._policy.free_drafts_pay(self.expected, self.max_length, self.remaining)
        return True if verdict is None else bool(verdict)

    def _pays_under_load(self, state: Any) -> bool:
        """Free rounds beat the target alone with the load counted as it is now (the verify calls' cost
        to the requests ahead, the wait for the event loop); False while the costs are unmeasured."""
        if self.expected < self.min_tokens:
            return False
        return bool(self._policy.free_drafts_pay(self.expected, self.max_length, self.remaining, queue_delay_s=state.queue_delay_s))

    def choose(self, state: Any) -> Decision:
        if self.free:
            return Decision(0, _FREE_UNTIL_DRY) if self._dry else Decision(self.max_length)
        decision = self._policy.choose(state)
        k, load_reason = decision.length, decision.load_reason
        stepped_aside = load_reason is not None  # load: free rounds load the target too
        if k <= 0 and state.rounds_so_far == 0 and not stepped_aside and self._pays():
            # The policy turned speculation off at this request's first round rather than at its start.
            self.free = True
            self.free_drafters()
            return Decision(self.max_length)
        if k <= 0 and state.rounds_so_far == 0 and stepped_aside and self._pays_under_load(state):
            # Sent aside for the load, which the draft model's rounds would add to (a draft call and
            # a verify call each), where rounds of free drafts still pay with that load counted.
            k, load_reason = 1, None
        if k > 0 and state.rounds_so_far == 0 and self.expected >= self.min_tokens:
            # The index expects to go on: the first round is drafted by the free drafters alone, as
            # long as the index expects (the policy sized it for the draft model). Where the index
            # is wrong for this request, the round costs a verify call; a model draft of that length
            # would have cost a draft call as well.
            self.free_drafters(True)
            self._first_round_free = True
            k = max(k, min(self.max_length, math.ceil(self.expected)))
        return Decision(k, decision.reason if k <= 0 else "", load_reason)

    def pipeline_pays(self, k: int) -> bool:
        return self._policy.pipeline_pays(k)

    def _first_round_done(self) -> None:
        if self._first_round_free and not self.free:
            self.free_drafters(False)
        self._first_round_free = False

    def observe(self, record: Any) -> None:
        self._first_round_done()
        self._policy.observe(record)

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        self._first_round_done()
        self._policy.observe_plain(tokens, latency_s)
        if self.free:
            self._dry = True  # a round without a free proposal: the target finishes alone


def gate_free_drafts(drafter: Any, policy: Any, context: Context, index: SuffixIndex, max_tokens: int | None) -> tuple[Any, Any]:
    """This request's drafter and policy: a `FreeDraftGate` around `policy`, and a copy of a combined
    drafter that the gate can restrict to its free drafters (what it learns is shared).

    A sampled request is not gated: the index's expectation counts tokens a greedy answer would repeat,
    but a sampled request keeps a free draft's token with the target's probability of it. On real vLLM
    (81 M target, T=0.7, after greedy requests on the same prompts) a gated request drafted 32 tokens
    free, kept 2 of them, and its verify call took 932 ms, 35 of the target's tokens: the client ran
    0.78x the target alone. Its rounds are the policy's own."""
    if not context.sampling.greedy:
        return drafter, policy
    if isinstance(drafter, CombinedDrafter):
        drafter = drafter.with_drafters(list(drafter.drafters))
    policy = as_policy(policy)
    # Free rounds: as long as the policy lets drafts without a call be (`free_max_length`).
    max_length = int(policy.free_max_length)
    every = list(drafter.drafters) if isinstance(drafter, CombinedDrafter) else []

    def free_drafters(only: bool = True) -> None:
        """Draft with the free drafters only (or with every one again)."""
        if isinstance(drafter, CombinedDrafter):
            drafter.drafters = drafter.free_only().drafters if only else list(every)

    expected = expected_continuation(index, context, max_length)
    return drafter, FreeDraftGate(policy, expected, free_drafters, max_length=max_length, remaining=max_tokens)
