"""What a draft-length policy is: the state it sees (`PolicyState`), what it returns (`Start` at a
request's start, `Decision` at each round), the interface (`DraftLengthPolicy`, with `PolicyBase`'s
defaults and `as_policy` for a caller's own object) and the simplest policy, `FixedDraftLength`.

A policy is shared by all the requests of a client; what it decides for one request travels in the
value it returns, never in an attribute another request could overwrite meanwhile. `specapi.parts.policy`
holds the adaptive policy and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, cast

from ..transport._exceptions import ConfigurationError
from ..core.stats import MODEL_DRAFTER, RoundRecord

__all__ = [
    "PolicyState",
    "Decision",
    "Start",
    "DraftLengthPolicy",
    "PolicyBase",
    "as_policy",
    "FixedDraftLength",
    "SPECULATE",
    "RECHECK",
    "TARGET_ALONE",
    "LOAD_TARGET_ALONE",
    "LOAD_DRAFT_LENGTH",
    "LOAD_STREAM_FASTER",
]


@dataclass(frozen=True)
class PolicyState:
    remaining_tokens: int
    rounds_so_far: int
    recheck: bool = False  # this request was granted to re-measure speculation
    #: Which draft positions this request's own model-drafted rounds had accepted, round by round.
    accepted_by_position: tuple[tuple[bool, ...], ...] = ()
    #: The drafter of this request's last round ("" before its first), and the same flags for the
    #: request's rounds by that drafter.
    last_drafter: str = ""
    last_drafter_rounds: tuple[tuple[bool, ...], ...] = ()
    #: At a request's first round, with earlier requests in flight: how long a step of the client's event
    #: loop waited for its turn (`load.queue_delay`, measured for a policy whose `watches_queue` is
    #: true); 0 otherwise. Each call of a round waits about as long again, the target alone's stream once.
    queue_delay_s: float = 0.0
    #: The request samples (temperature > 0): the policy reads the acceptance learnt from sampled rounds.
    sampled: bool = False

    @property
    def last_round_free(self) -> bool:
        """This request's last round was drafted without a draft call (suffix index, prompt lookup)."""
        return bool(self.last_drafter) and self.last_drafter != MODEL_DRAFTER


SPECULATE, RECHECK, TARGET_ALONE = "speculate", "recheck", "target-alone"


@dataclass(frozen=True)
class Start:
    """What `start_request` decided for a request: `mode` (SPECULATE, RECHECK or TARGET_ALONE) and, for
    the target alone, why."""

    mode: str
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    """What `choose` decided for a round: the draft `length` (0: the target writes the rest alone),
    `reason` (why speculation stops, when it does) and `load_reason` (a `LOAD_*` value: what the load on
    the upstreams changed, None if nothing)."""

    length: int
    reason: str = ""
    load_reason: str | None = None

#: `SpeculativeStats.load_reason` values: what the load on the upstreams changed for a request.
LOAD_TARGET_ALONE = "target alone under load: the added calls would cost the other requests more than they save"
LOAD_DRAFT_LENGTH = "draft length changed under load: the calls' cost to the other requests counted"
LOAD_STREAM_FASTER = "target alone under load: its stream writes faster now than rounds of calls, which queue each time"


class DraftLengthPolicy(Protocol):
    """Says how many tokens to draft next. Beside the four calls, the members below say what the engine
    and the suffix gate read from a policy (`PolicyBase` has the defaults, and `as_policy` gives them to
    a caller's policy that declares only the calls, and whose calls may return a plain mode and length)."""

    name: str
    #: The policy reads `PolicyState.queue_delay_s`: the engine measures it before a first round.
    watches_queue: bool
    #: The longest draft for drafters that make no call (the suffix index, prompt lookup).
    free_max_length: int

    def start_request(self) -> Start:
        """Called once per request: SPECULATE, RECHECK (speculate to re-measure) or TARGET_ALONE."""
        ...

    def choose(self, state: PolicyState) -> Decision: ...

    def observe(self, record: RoundRecord) -> None: ...

    def observe_plain(self, tokens: int, latency_s: float) -> None: ...

    def pipeline_pays(self, k: int) -> bool:
        """Drafting the next round while this one (`k` drafted) is verified pays."""
        ...

    def free_drafts_pay(self, expected: float, k: int, remaining: int, *, queue_delay_s: float | None = None) -> bool | None:
        """Rounds of free drafts (`expected` tokens kept of `k`) beat the target alone on `remaining`
        tokens, by what the policy measured; None: not measured."""
        ...


class PolicyBase:
    """The defaults of `DraftLengthPolicy`'s members."""

    watches_queue: bool = False
    free_max_length: int = 16

    def pipeline_pays(self, k: int) -> bool:
        return True

    def free_drafts_pay(self, expected: float, k: int, remaining: int, *, queue_delay_s: float | None = None) -> bool | None:
        return None


class _CallerPolicy(PolicyBase):
    """A caller's policy object, with the members it does not declare taken from `PolicyBase`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = self._declared("name", "policy")
        # The free length a caller's policy declares, or its (model) length, or a fixed policy's k.
        self.free_max_length = int(self._declared("free_max_length", self._declared("max_length", self._declared("k", 16))))
        self.watches_queue = bool(self._declared("watches_queue", False))

    def _declared(self, member: str, default: Any) -> Any:
        # A caller's policy is duck-typed (the documented interface is the four calls): what else it
        # declares is read here, once.
        return getattr(self.inner, member, default)

    def start_request(self) -> Start:
        started = self.inner.start_request()  # a `Start`, or the mode alone
        return started if isinstance(started, Start) else Start(str(started))

    def choose(self, state: PolicyState) -> Decision:
        chosen = self.inner.choose(state)  # a `Decision`, or the length alone
        return chosen if isinstance(chosen, Decision) else Decision(int(chosen))

    def observe(self, record: RoundRecord) -> None:
        self.inner.observe(record)

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        self.inner.observe_plain(tokens, latency_s)

    def pipeline_pays(self, k: int) -> bool:
        pays = self._declared("pipeline_pays", None)
        return True if pays is None else bool(pays(k))

    def free_drafts_pay(self, expected: float, k: int, remaining: int, *, queue_delay_s: float | None = None) -> bool | None:
        measured = self._declared("free_drafts_pay", None)
        if measured is None:
            return None
        if queue_delay_s is None:
            return measured(expected, k, remaining)  # type: ignore[no-any-return]
        return measured(expected, k, remaining, queue_delay_s=queue_delay_s)  # type: ignore[no-any-return]


def as_policy(policy: Any) -> DraftLengthPolicy:
    """`policy` with every member of `DraftLengthPolicy` (specapi's policies have them already)."""
    return cast(DraftLengthPolicy, policy if isinstance(policy, PolicyBase) else _CallerPolicy(policy))


class FixedDraftLength(PolicyBase):
    """Always draft `k` tokens."""

    name = "fixed"

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        self.k = k
        self.free_max_length = k

    def start_request(self) -> Start:
        return Start(SPECULATE)

    def choose(self, state: PolicyState) -> Decision:
        return Decision(self.k)

    def observe(self, record: RoundRecord) -> None:
        pass

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        pass
