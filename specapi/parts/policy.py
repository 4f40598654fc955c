"""The adaptive draft-length policy: `AdaptiveDraftLength` measures what speculation and the target
alone cost on this client and drafts the length that is predicted fastest, or none.

It sees a `PolicyState` and returns a `Decision` (specapi/parts/draft_length.py, whose names are re-exported
here with the interface). Policies are shared by all the requests of a client, so what they learn
carries over to later requests; what they decide for one request travels in the value they return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..transport._exceptions import ConfigurationError
from .draft_length import (
    LOAD_DRAFT_LENGTH,
    LOAD_STREAM_FASTER,
    LOAD_TARGET_ALONE,
    RECHECK,
    SPECULATE,
    TARGET_ALONE,
    Decision,
    DraftLengthPolicy,
    FixedDraftLength,
    PolicyBase,
    PolicyState,
    Start,
    as_policy,
)
from ..core.load import LoadCurve, current_request
from .policy_costs import MEASURED_LOAD_REACH, _Linear, expected_tokens_by_position, load_measured
from ..core.stats import MODEL_DRAFTER, RoundRecord, drafter_of

__all__ = [
    "PolicyState",
    "Decision",
    "Start",
    "DraftLengthPolicy",
    "PolicyBase",
    "as_policy",
    "FixedDraftLength",
    "AdaptiveDraftLength",
    "expected_tokens_by_position",
    "SPECULATE",
    "RECHECK",
    "TARGET_ALONE",
    "LOAD_TARGET_ALONE",
    "LOAD_DRAFT_LENGTH",
    "LOAD_STREAM_FASTER",
    "load_measured",
]

_SLOWER = "adaptive policy: speculation predicted slower than the target alone"


def _loaded(load: LoadCurve | None) -> bool:
    return load is not None and load.requests > 1


class AdaptiveDraftLength(PolicyBase):
    """Choose the draft length that maximises expected tokens per second, or 0 when speculation loses.

    It learns, across all the requests of a client: acceptance by draft position for each drafter
    apart (exponentially forgetting, each position's prior the estimate of the one before it),
    draft-call latency as fixed + per-token cost, verify-call latency, and the target's own speed.
    Each round it picks K = argmax E(K) / (draft(K) + verify) (speculation.md's arithmetic), with the
    acceptance scaled to how the request's own rounds fared (`acceptance(own)`), and compares that
    rate with the target generating alone. When speculation with the draft model loses it returns 0,
    so the target generates the rest in one call; every `recheck_every` requests it speculates again,
    in case things changed. A request whose last round was drafted without a call (suffix index,
    prompt lookup) is judged on that drafter's figures and its own rounds by it (`_choose_free`).
    Under load, a draft of the next round is made during verification only where it is likely used
    (`pipeline_pays`).

    Cold start: no request is given up to measurement. The target's own speed is a line in the tokens
    of a call; verify calls give its one-token end, and while the per-token slope is unknown the
    target writes the rest of the first request alone once two of its rounds have measured
    speculation (text it would have written anyway; at most `_MEASURED_REST` tokens, else its last
    `calibration_tokens`), which gives the other end: on a target that is faster alone, speculation
    stops after two rounds, not after a request. A request with no end in sight (no `max_tokens`)
    measures on its rest, from the third request on, if nothing has measured it by then.

    Load: with `watch_load` (the client does it), the policy sees each upstream's `LoadCurve`: requests
    in flight and how call latency grows with them. A round's calls then also cost the requests
    ahead of this one (in start order) the measured slope each; the draft length maximises tokens per
    second with that cost counted, and a request whose speculation would not beat the target alone
    lets the target generate the rest alone (admission, judged every round: later ones step aside
    first; a burst starts before the curve has seen its load, so requests admitted then step aside
    once the burst's own calls have measured it). The decision's `load_reason` says so
    (`LOAD_TARGET_ALONE`, `LOAD_DRAFT_LENGTH`). At one request in flight nothing
    changes. What the curve cannot see at a burst's start (no call has come back yet), the client's
    own queue shows: a request's first round is told how long a step of the event loop waited for its
    turn (`PolicyState.queue_delay_s`), and its draft call and verify call are each charged that wait,
    the target alone's stream once; a request that then loses steps aside before its first call (the
    earliest in flight goes on measuring). In a cold burst of 100 through `specapi serve` that wait
    grew with each request's place, to about 40 ms; with 16 requests on one client it stayed under 3 ms.

    Args:
        max_length: the longest draft considered for the draft model.
        free_max_length: the longest draft considered for drafters that make no call (the suffix index,
            prompt lookup, a prediction); default: 32, or `max_length` if longer. Their drafts cost no
            draft call, and every round sends the whole text again: a suffix index repeating a known
            answer covers it in fewer, longer rounds (the rate each length is predicted to give decides,
            as for the model).
        start_length: the length used before anything is measured.
        margin: start speculating only if it is predicted faster than the target alone by this factor;
            once speculating, stop only when predicted slower by this factor. The band between keeps
            estimates that hover around equality (noise, a burst's slower calls) from flipping every
            request in flight to the target alone and back: a request sent to the target alone
            wrongly takes up to the target's whole time, one kept speculating wrongly loses what the
            band allows.
        recheck_every: while off, speculate on one request out of this many to re-measure.
        calibration_tokens: while the target's speed is unknown, the target writes this many last tokens alone.
    """

    name = "adaptive"
    watches_queue = True  # reads `PolicyState.queue_delay_s`: the engine measures it for this policy
    _PRIOR_SEEN = 2.0  # pseudo-observations of the prior per position (Beta(1, 1) at the first)
    _JUDGED_TOKENS = 64  # the length a request is judged at before its own length is known
    # The longest rest of a request the target writes alone to measure its own speed once speculation is
    # measured: what the client gives up is the speculation of at most this many tokens, once.
    _MEASURED_REST = 256
    _OWN_PRIOR_SEEN = 5.0  # draft positions the client-wide acceptance is worth against a request's own
    # The same for a drafter without a call: its drafts for one request come from one source (an earlier
    # answer, the prompt), and whether that source fits the request its first rounds show at once.
    _OWN_PRIOR_SEEN_FREE = 1.0

    def __init__(
        self,
        *,
        max_length: int = 10,
        free_max_length: int | None = None,
        start_length: int = 4,
        margin: float = 1.05,
        recheck_every: int = 20,
        min_rounds: int = 4,
        calibration_tokens: int = 8,
    ) -> None:
        if max_length < 1 or start_length < 1 or start_length > max_length:
            raise ConfigurationError("need 1 <= start_length <= max_length")
        if free_max_length is None:
            free_max_length = max(32, max_length)
        if free_max_length < 1:
            raise ConfigurationError("need free_max_length >= 1")
        if margin <= 0 or recheck_every < 1:
            raise ConfigurationError("margin must be > 0 and recheck_every >= 1")
        if calibration_tokens < 2:
            raise ConfigurationError("calibration_tokens must be >= 2")
        self.max_length = max_length
        self.free_max_length = free_max_length
        self._positions = max(max_length, free_max_length)  # the acceptance tables' length
        self.start_length = start_length
        self.margin = margin
        self.recheck_every = recheck_every
        self.min_rounds = min_rounds
        self.calibration_tokens = calibration_tokens
        self._rounds_seen = 0
        # Acceptance by position, one table per drafter and temperature band (decayed counts, without the
        # prior): accepted, seen. Keyed by `_band_key`.
        self._tables: dict[str, tuple[list[float], list[float]]] = {}
        self._sampled = False  # the band of the request being decided (the last `choose`)
        self._last_drafter = MODEL_DRAFTER  # the drafter of the client's last round
        self._draft = _Linear()
        self._verify = _Linear()
        self._target = _Linear()
        self._draft_share = 1.0  # fraction of rounds whose draft was a call
        self._requests = 0
        self._off = False
        self._measuring = False  # a request is measuring the target on its rest
        self._target_load: LoadCurve | None = None
        self._draft_load: LoadCurve | None = None

    def watch_load(self, target: LoadCurve | None, draft: LoadCurve | None = None) -> None:
        """Read the upstreams' load from these curves (`RoleClient.load`)."""
        self._target_load, self._draft_load = target, draft

    # -- what it has learnt -------------------------------------------------------------------
    def acceptance(self, own: Sequence[Sequence[bool]] = (), *, drafter: str | None = None) -> list[float]:
        """P(accept position i | positions before it accepted) of `drafter`'s drafts: by default the
        draft model's, or (a client whose model never drafted) those of the drafter of its last round.
        Drafters are learnt apart: a suffix index repeating a known answer has every position accepted,
        prompt lookup on new text few, and with one table for all the draft model's drafts would look as
        good as the best of them (requests on new text then drafted long and lost).

        The first position starts from a Beta(1, 1) prior; each later one from the estimate of the
        position before it, worth `_PRIOR_SEEN` observations, so that a deep position seen a few times
        is not judged on them alone (one unlucky rejection would keep the policy from drafting that
        far again, and so from ever measuring it better). A position never reached takes the estimate
        of the one before it, so the policy is willing to try longer drafts when the first hold up.

        `own`: one request's rounds so far (accepted flags by position). Acceptance depends on the
        text (code or prose, boilerplate or not), so a request's own rounds soon speak for it, where
        a client's concurrent requests on different texts would otherwise all draft for their
        average. Every position's estimate is scaled by how the request's positions fared against
        the client-wide estimates for them: (accepted + w) / (expected + w), with the client-wide
        estimate worth `w = _OWN_PRIOR_SEEN` positions.
        """
        estimates: list[float] = []
        if drafter is None:
            drafter = MODEL_DRAFTER if self._table(MODEL_DRAFTER) is not None else self._last_drafter
        accepted_by, seen_by = self._table(drafter) or ([0.0] * self._positions, [0.0] * self._positions)
        for accepted, seen in zip(accepted_by, seen_by):
            prior = estimates[-1] if estimates else 0.5
            estimates.append((accepted + self._PRIOR_SEEN * prior) / (seen + self._PRIOR_SEEN))
        return self._scaled(estimates, own) if own else estimates

    def _table(self, drafter: str) -> tuple[list[float], list[float]] | None:
        """`drafter`'s acceptance table in the band being decided (greedy or sampled). Greedy drafts are kept
        while they are the target's argmax, sampled ones with the target's probability of them: for the
        same drafts the two differ (measured on the simulator's LAN pair at T=0.7: 61% against 36%), so
        one table for both would draft too long for sampled requests and too short for greedy ones. A
        band with no rounds yet reads the other band's table."""
        own = self._tables.get(_band_key(drafter, self._sampled))
        return own if own is not None else self._tables.get(_band_key(drafter, not self._sampled))

    def _scaled(self, estimates: list[float], own: Sequence[Sequence[bool]], weight: float | None = None) -> list[float]:
        """The client-wide `estimates` scaled to one request's own rounds (see `acceptance`); `weight`:
        what the estimates are worth, in draft positions (`_OWN_PRIOR_SEEN` by default)."""
        accepted_own = expected_own = 0.0
        for flags in own:
            for i, ok in enumerate(flags[: len(estimates)]):
                expected_own += estimates[i]
                accepted_own += ok
                if not ok:
                    break
        w = self._OWN_PRIOR_SEEN if weight is None else weight
        scale = (accepted_own + w) / (expected_own + w)
        return [min(1.0, p * scale) for p in estimates]

    def predicted_speculative_rate(
        self, k: int, load_s: float = 0.0, acceptance: Sequence[float] | None = None, *, free: bool = False
    ) -> float:
        """Tokens per second of rounds drafting `k`; `load_s`: seconds each round costs others;
        `acceptance`: by position (the draft model's client-wide estimate if None); `free`: drafts
        without a call."""
        round_s = self._round_s(k, load_s, free)
        acceptance = self.acceptance() if acceptance is None else acceptance
        return expected_tokens_by_position(acceptance, k) / round_s if round_s > 0 else float("inf")

    def _round_s(self, k: int, load_s: float, free: bool) -> float:
        """Seconds of a round drafting `k`: its draft call (none for `free` drafts), its verify call, `load_s`."""
        draft_s = self._draft.predict(k) if self._draft.known and not free else 0.0
        return draft_s + self._verify.predict(k) + load_s

    def predicted_target_rate(self, remaining: int) -> float | None:
        """Tokens per second of the target writing `remaining` tokens alone, as at one request in flight."""
        if not self._target.has_slope:
            return None
        seconds = self._target.predict(remaining)
        return remaining / seconds if seconds > 0 else None

    def predicted_target_rate_now(self, remaining: int, delay_s: float = 0.0) -> float | None:
        """`predicted_target_rate` under the load now (`_target_seconds_now`); `delay_s`: added once."""
        if not self._target.has_slope:
            return None
        seconds = self._target_seconds_now(remaining) + delay_s
        return remaining / seconds if seconds > 0 else None

    def _target_seconds_now(self, remaining: int) -> float:
        """The target alone's `remaining` tokens under the load now, in the same one-stream seconds as the
        rounds (its line must have a slope).

        Rounds are calls, and a call under load is slower by the measured inflation: the rounds'
        latencies are learnt with it divided out. The target alone's stream pays it on its first token
        only; its later tokens come at the pace streams write at now (`LoadCurve.stream_pace`), which on
        a server queueing new requests stays near its pace alone. So its per-token cost, in one-stream
        seconds, is that pace divided by the inflation, where that is less than the line's (never more:
        a server whose streams slow down with the load as much as its calls leaves the line as it is)."""
        seconds = self._target.predict(remaining)
        load = self._target_load
        pace = load.stream_pace if load is not None else None
        if pace is None or remaining <= 0:
            return seconds
        inflation = self._inflation(load)
        if inflation <= 1.0:
            return seconds
        fixed = self._target.predict(0)
        return fixed + min((seconds - fixed) / remaining, pace / inflation) * remaining

    def best_length(
        self, remaining: int, load_s: float = 0.0, acceptance: Sequence[float] | None = None, *, free: bool = False
    ) -> tuple[int, float]:
        """The draft length with the highest `predicted_speculative_rate` (up to `free_max_length` for
        drafts without a call, `max_length` otherwise, and short of `remaining`), and that rate."""
        acceptance = self.acceptance() if acceptance is None else acceptance
        longest = self.free_max_length if free else self.max_length
        best_k, best_rate = 1, 0.0
        total = survive = 1.0  # `expected_tokens_by_position(acceptance, k)`, carried from one k to the next
        for k in range(1, min(longest, max(1, remaining - 1)) + 1):
            survive *= acceptance[k - 1] if k <= len(acceptance) else (acceptance[-1] if acceptance else 0.0)
            total += survive
            round_s = self._round_s(k, load_s, free)
            rate = total / round_s if round_s > 0 else float("inf")
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def _rank(self) -> int:
        """The running request's place among those in flight on the target, in start order (1 = earliest)."""
        return self._target_load.rank(current_request.get()) if self._target_load is not None else 1

    @staticmethod
    def _inflation(load: LoadCurve | None) -> float:
        return load.inflation() if load is not None else 1.0

    def load_cost(self, rank: int) -> float:
        """Seconds one round of the request at `rank` (in start order) adds to the requests ahead of
        it: its verify call on the target, its draft call (if drafts are calls) on the draft."""
        cost = self._target_load.cost_to_others(rank) if self._target_load is not None else 0.0
        if self._draft_load is not None and self._draft_load is not self._target_load:
            cost += self._draft_share * self._draft_load.cost_to_others(rank)
        elif self._draft_load is self._target_load and cost:
            cost *= 1.0 + self._draft_share  # draft and target on one server: both calls load it
        return cost

    def free_drafts_pay(self, expected: float, k: int, remaining: int, *, queue_delay_s: float | None = None) -> bool | None:
        """Whether rounds of free drafts (no draft call) of `k` tokens, each expected to have `expected`
        tokens accepted, beat the target generating `remaining` tokens alone; None while unmeasured.

        `queue_delay_s` (a request's first round under load, `PolicyState.queue_delay_s`): judged as
        things are now, each round with its verify call's cost to the requests ahead of this one and
        the wait for the event loop, which the target alone's stream waits once; None too for a
        request placed beyond the loads the target's curve has measured (`load_measured`)."""
        if not self._verify.known or not self._target.has_slope:
            return None
        rounds = math.ceil(remaining / (1.0 + min(expected, k)))
        added = waited = 0.0
        if queue_delay_s is not None:
            rank = self._rank()
            if self._target_load is not None and not load_measured(self._target_load, rank):
                return None  # a burst beyond the loads measured: its verify calls' cost to the others is unknown
            inflation = self._inflation(self._target_load)
            others = self._target_load.cost_to_others(rank) if self._target_load is not None else 0.0
            waited = queue_delay_s / inflation
            added = others / inflation + waited
        return rounds * (self._verify.predict(k) + added) * self.margin < self._target_seconds_now(remaining) + waited

    # -- the strategy interface ---------------------------------------------------------------
    def start_request(self) -> Start:
        self._requests += 1
        if not self._off:
            return Start(SPECULATE)
        mode = RECHECK if self._requests % self.recheck_every == 0 else TARGET_ALONE
        return Start(mode, _SLOWER)

    def choose(self, state: PolicyState) -> Decision:
        self._sampled = state.sampled
        rank = self._rank()
        if rank <= 1 and self._measure_target_early(state):
            # Speculation's cost is measured and the target's is not: the target writes this request's
            # rest alone (what it would cost without speculation), and from the next request on the two
            # are compared. On a target faster alone, this is where the first request stops losing.
            self._measuring = True
            return Decision(0, "adaptive policy: the target wrote the rest alone once, to measure its own speed")
        if self._rounds_seen < self.min_rounds or not self._verify.known:
            if state.last_round_free and self._verify.known and rank <= 1:
                # Free drafts add no call: their length is judged on the verify calls' cost alone.
                return self._choose_free(state, rank)
            return self._unmeasured_under_load() if rank > 1 else Decision(self.start_length)
        if rank > 1 and state.rounds_so_far == 0 and not self._target.has_slope:
            # The target's own speed is not measured yet: nothing to weigh the added calls against,
            # and every load check below needs it. As with speculation unmeasured, the earliest request
            # goes on (it measures the target on its last tokens) and a later one starts with the
            # target alone (which measures it too); one already speculating goes on.
            return self._unmeasured_under_load()
        if not self._target.has_slope and self._measure_target_now(state):
            self._measuring = True
            return Decision(0, "adaptive policy: the target wrote the rest alone once, to measure its own speed")
        if state.last_round_free:
            return self._choose_free(state, rank)
        own_rounds = state.accepted_by_position
        client = self.acceptance()
        own = self._scaled(client, own_rounds) if own_rounds else client
        if state.recheck and state.rounds_so_far < self.min_rounds:
            return Decision(self.best_length(state.remaining_tokens, 0.0, own)[0])  # re-measure before judging again
        return self._choose_measured(state, rank, client, own)

    def _choose_measured(self, state: PolicyState, rank: int, client: list[float], own: list[float]) -> Decision:
        """`choose` once speculation and the target are measured: the best length with the load's cost
        counted, unless the verdict on speculation, this request's own drafts or the load say the
        target alone."""
        inflation = self._inflation(self._target_load)
        load_s = self.load_cost(rank) / inflation  # in one-stream seconds, as the models
        # A first round under load also waits for the client's own event loop: its draft call and its
        # verify call each about `queue_delay_s`, the target alone's stream once (the earliest request
        # in flight goes on measuring speculation, as with the curve's cost).
        waited = state.queue_delay_s / inflation if state.rounds_so_far == 0 and rank > 1 else 0.0
        load_s += 2.0 * waited
        k, rate = self.best_length(state.remaining_tokens, load_s, own)
        unloaded_k, unloaded_rate = self.best_length(state.remaining_tokens, 0.0, own) if load_s else (k, rate)
        baseline = self.predicted_target_rate(state.remaining_tokens)
        if baseline is not None:
            # The verdict on speculation for the client is judged on its acceptance, not one text's.
            own_rounds = state.accepted_by_position
            client_rate = self.best_length(state.remaining_tokens, 0.0, client)[1] if own_rounds else unloaded_rate
            if client_rate < baseline * (self.margin if self._off else 1.0 / self.margin):
                self._off = True
                return Decision(0, _SLOWER)
            self._off = False
            # Sending a request to the target alone is judged on its own acceptance only after
            # `min_rounds` of its own rounds (its draft length follows them from the first).
            judged_on_its_own = len(own_rounds) >= self.min_rounds
            if judged_on_its_own and unloaded_rate < baseline / self.margin:
                return Decision(0, "adaptive policy: this request's drafts predicted slower than the target alone (its own acceptance)")
            judged_rate = rate if judged_on_its_own or not own_rounds else self.best_length(state.remaining_tokens, load_s, client)[1]
            aside = self._stepping_aside(state, judged_rate, baseline, load_s, waited)
            if aside is not None:
                return aside
        return Decision(k, load_reason=LOAD_DRAFT_LENGTH if k != unloaded_k else None)

    def _stepping_aside(self, state: PolicyState, rate: float, baseline: float, load_s: float, waited: float) -> Decision | None:
        """The target alone for this request when, under load, it writes faster than rounds of calls
        (`rate`, as judged): None when speculating still pays."""
        admitted = state.rounds_so_far > 0  # already speculating: the band's lower edge applies
        alone = self.predicted_target_rate_now(state.remaining_tokens, waited)
        if alone is None or not rate < alone * (1.0 / self.margin if admitted else self.margin):
            return None
        if load_s <= 0:
            # No cost to others (the earliest request in flight, or a flat curve), but under load the
            # target alone's stream may write faster than rounds of calls: they wait in the server's
            # queue each time, the stream once. Otherwise the verdict above decided.
            return self._stream_faster() if alone > baseline else None
        # Admission, judged again every round: a burst of requests starts before the curve has seen that
        # load, so the later ones in start order step aside as soon as the calls made meanwhile measure
        # it. Not a verdict on speculation, which stays on; this request steps aside for the others (the
        # target writes its rest alone). A request drafting free (no draft call) is judged by
        # `_choose_free`.
        reason = "adaptive policy: " + LOAD_TARGET_ALONE
        if waited:
            reason += f" (this client's event loop was busy: a step waited {state.queue_delay_s * 1000:.1f} ms for its turn)"
        return Decision(0, reason, LOAD_TARGET_ALONE)

    def pipeline_pays(self, k: int) -> bool:
        """Whether to draft the next round while this one (`k` drafted by the model) is verified. The
        pipelined draft is used only if every drafted token is kept; with requests ahead of this one its
        call slows theirs whether used or not, so it is made then only when that is likelier than not."""
        rank = self._rank()
        if rank <= 1:
            return True
        return math.prod(self.acceptance()[:k]) >= 0.5

    def _choose_free(self, state: PolicyState, rank: int) -> Decision:
        """The next round of a request whose last round was drafted without a call (its next one most
        likely is too: the suffix index or the prompt goes on): judged on the free drafts' acceptance,
        scaled to the request's own free rounds, with no draft call in the round. It keeps going under
        load (its rounds add a verify call only, each in place of tokens streamed one by one) and
        whatever the verdict on the draft model, until its own drafts are predicted slower than the
        target alone."""
        client = self.acceptance(drafter=state.last_drafter)
        own_rounds = state.last_drafter_rounds
        own = self._scaled(client, own_rounds, self._OWN_PRIOR_SEEN_FREE) if own_rounds else client
        load_s = self.load_cost(rank) / self._inflation(self._target_load)
        k, rate = self.best_length(state.remaining_tokens, load_s, own, free=True)
        unloaded_k, unloaded_rate = self.best_length(state.remaining_tokens, 0.0, own, free=True) if load_s else (k, rate)
        baseline = self.predicted_target_rate(state.remaining_tokens)
        if baseline is not None and unloaded_rate < baseline / self.margin:
            return Decision(0, f"adaptive policy: this request's {state.last_drafter} drafts predicted slower than the target alone")
        alone = self.predicted_target_rate_now(state.remaining_tokens)
        if baseline is not None and alone is not None and alone > baseline and rate < alone / self.margin:
            return self._stream_faster()
        return Decision(k, load_reason=LOAD_DRAFT_LENGTH if k != unloaded_k else None)

    @staticmethod
    def _stream_faster() -> Decision:
        """The target alone writes the rest: under load its stream is faster now than this request's rounds."""
        return Decision(0, "adaptive policy: " + LOAD_STREAM_FASTER, LOAD_STREAM_FASTER)

    @staticmethod
    def _unmeasured_under_load() -> Decision:
        """Requests in flight ahead of this one while speculation, or the target's own speed, is not
        measured yet (a burst on a cold client, or on a worker whose warm-up did not measure the target):
        nothing says the added calls pay, so the earliest request speculates (and measures) and later
        ones let the target generate alone (which measures the target); from then on the measured costs
        decide. At one request in flight this never applies."""
        return Decision(0, "adaptive policy: " + LOAD_TARGET_ALONE + " (not measured yet)", LOAD_TARGET_ALONE)

    def _measure_target_now(self, state: PolicyState) -> bool:
        """While the target's speed is unknown: at the end of a request (its last few tokens); on the rest
        of one from the third request on (requests that never come near their limit); earlier, see
        `_measure_target_early`."""
        if state.remaining_tokens <= self.calibration_tokens:
            return state.remaining_tokens >= 2
        return self._requests >= 3 and state.rounds_so_far >= self.min_rounds and not self._measuring

    def _measure_target_early(self, state: PolicyState) -> bool:
        """Whether the target writes this request's rest alone now, to measure its own speed: speculation
        is measured and the target is not, the request has run two rounds (the first also opens
        connections) and has at most `_MEASURED_REST` tokens left."""
        if self._target.has_slope or not self._verify.known or self._measuring:
            return False
        return state.remaining_tokens <= self._MEASURED_REST and 2 <= state.rounds_so_far <= self.min_rounds

    def observe(self, record: RoundRecord) -> None:
        decay = 0.98
        drafter = drafter_of(record)
        self._last_drafter = drafter
        key = _band_key(drafter, record.sampled)
        if key not in self._tables:
            self._tables[key] = ([0.0] * self._positions, [0.0] * self._positions)
        accepted, seen = self._tables[key]  # by position, of this drafter's drafts in this band (see `acceptance`)
        for i, ok in enumerate(record.accepted_by_position[: self._positions]):
            accepted[i] = accepted[i] * decay + ok
            seen[i] = seen[i] * decay + 1
            if not ok:
                break  # later positions were not reached: they say nothing about acceptance
        self._rounds_seen += 1
        self._draft_share = 0.9 * self._draft_share + 0.1 * drafter.startswith(MODEL_DRAFTER)
        if self._rounds_seen == 1:
            return  # the first calls also open connections: their latency says little about later ones
        # Latencies are learnt as at one request in flight (the measured inflation divided out), and
        # per-token costs from calls made alone: under load a call moves a line's level only. Loaded
        # one-token verify samples would bend the target's line, and in a burst the long drafts come
        # at the busiest moments, so a slope through loaded calls takes the load for a cost per token
        # (seen at 100 streams: 0.19 s to verify one token, 1.9 s for ten; speculation turned off).
        draft_inflation = self._inflation(self._draft_load)
        target_inflation = self._inflation(self._target_load)
        if record.drafted:
            self._draft.add(record.drafted, record.draft_latency_s / draft_inflation, keep_slope=_loaded(self._draft_load))
        verify = record.verify_latency_s / target_inflation
        loaded = _loaded(self._target_load)
        self._verify.add(record.drafted, verify, keep_slope=loaded)
        self._target.add(1, verify, keep_slope=loaded)  # a verify call is also a one-token target call

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        if tokens > 0:
            measured = self._target.has_slope
            self._target.add(tokens, latency_s / self._inflation(self._target_load))
            self._measuring = self._measuring and not self._target.has_slope
            if not measured and self._target.has_slope and self._verify.known:
                # Just measured: judge now, so the next request starts knowing (a request that
                # starts with the target alone may still speculate with free drafts).
                baseline = self.predicted_target_rate(self._JUDGED_TOKENS)
                self._off = baseline is not None and self.best_length(self._JUDGED_TOKENS)[1] < baseline / self.margin

    # -- what other processes measured (`specapi.share`) ----------------------------------------
    _MEASUREMENTS_VERSION = 1

    def measurements(self) -> dict[str, object]:
        """What this policy has measured, as JSON-ready data another process can `adopt`: acceptance
        by position per drafter and the calls' latency lines (not the load: that is this process's)."""
        return {
            "version": self._MEASUREMENTS_VERSION,
            "positions": self._positions,
            "rounds_seen": self._rounds_seen,
            "tables": {name: [list(a), list(s)] for name, (a, s) in self._tables.items()},
            "draft": self._draft.state(),
            "verify": self._verify.state(),
            "target": self._target.state(),
            "draft_share": self._draft_share,
            "last_drafter": self._last_drafter,
            "off": self._off,
        }

    def adopt(self, measurements: dict[str, object]) -> bool:
        """Start from another process's `measurements` where this policy has measured nothing yet (a new
        replica starts warm); True if they were taken. Data of another shape is ignored."""
        if self._rounds_seen or self._target.known or measurements.get("version") != self._MEASUREMENTS_VERSION:
            return False
        try:
            tables: dict[str, tuple[list[float], list[float]]] = {}
            for name, (accepted, seen) in dict(measurements["tables"]).items():  # type: ignore[call-overload]
                pad = [0.0] * max(0, self._positions - len(accepted))
                tables[str(name)] = ([float(v) for v in accepted][: self._positions] + pad, [float(v) for v in seen][: self._positions] + pad)
            lines = [_Linear(), _Linear(), _Linear()]
            for line, name in zip(lines, ("draft", "verify", "target")):
                line.set_state(measurements[name])  # type: ignore[arg-type]
            rounds_seen = int(measurements["rounds_seen"])  # type: ignore[call-overload]
            draft_share = float(measurements["draft_share"])  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            return False
        self._tables = tables
        self._draft, self._verify, self._target = lines
        self._rounds_seen = rounds_seen
        self._draft_share = draft_share
        self._off = bool(measurements.get("off"))
        self._last_drafter = str(measurements.get("last_drafter") or MODEL_DRAFTER)
        return True


def _band_key(drafter: str, sampled: bool) -> str:
    """The acceptance table of a drafter's rounds in one temperature band."""
    return f"{drafter} (sampled)" if sampled else drafter
