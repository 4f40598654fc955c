"""What every request of a client shares: the role clients, the drafter and draft-length policy built
from the client's arguments, path memory and suffix indexes per target model, and the engine that
serves one request (`Runtime.engine`).

`build_drafter`, `build_policy` and `acceptance_rule` turn the client's string choices into the
strategy objects, raising `ConfigurationError` for a bad one.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from openai import not_given

from ..transport._calls import Clock, Meter, RoleClient, Sleep
from ..transport._exceptions import ConfigurationError
from ..core.context import Context
from ..transport.degraded import FallbackWarnings
from ..parts.drafters import CombinedDrafter, Drafter, LookupDrafter, ModelDrafter, PredictionDrafter
from ..transport.endpoint import Endpoint
from ..engine.engine import Engine
from ..parts.free_gate import gate_free_drafts
from ..core.lossy import AcceptanceRule
from ..parts.paths import PathResolver
from ..parts.policy import AdaptiveDraftLength, DraftLengthPolicy, FixedDraftLength
from ..transport.pricing import call_cost
from ..parts.suffix import SuffixDrafter, SuffixIndex, indexes, learn, load_tokenizer, with_index, without_suffix

__all__ = ["MAX_OTHER_MODELS", "Runtime", "acceptance_rule", "build_drafter", "build_policy"]

#: Other models (`model=` on a call) that keep their own path memory and suffix index; least recently used leave.
MAX_OTHER_MODELS = 32


def _bound(table: OrderedDict[str, Any]) -> None:
    while len(table) > MAX_OTHER_MODELS:
        table.popitem(last=False)


class Runtime:
    """What every request of a client shares: the role clients, the policy, the verifier choice."""

    def __init__(
        self,
        *,
        target: Endpoint,
        draft: Endpoint | None,
        drafter: str | Drafter,
        policy: DraftLengthPolicy,
        verification: str,
        pipeline: bool,
        sleep: Sleep,
        clock: Clock,
        suffix_index: SuffixIndex | None = None,
        acceptance: AcceptanceRule = AcceptanceRule(),
    ) -> None:
        self.acceptance = acceptance
        self.target = RoleClient("target", target, sleep=sleep, clock=clock)
        self.draft = RoleClient("draft", draft, sleep=sleep, clock=clock) if draft is not None else None
        # What finished requests taught: shared per target model (another `model=` gets its own).
        self.suffix_index = suffix_index if suffix_index is not None else SuffixIndex()
        self._suffix_by_model: OrderedDict[str, SuffixIndex] = OrderedDict()
        # A caller's policy object may have no `max_length` (the `DraftLengthPolicy` protocol does not declare it).
        self.drafter = build_drafter(drafter, self.draft, self.suffix_index, paid_max_length=getattr(policy, "max_length", None))
        # Learning costs a little CPU per request: only where something drafts from it (or may, later).
        self.learning = suffix_index is not None or bool(indexes(self.drafter))
        self.on_learn: Callable[[str, list[int]], None] | None = None
        #: Streams the target writes alone from their first token are handed to the caller to relay
        #: (`Engine.relay_alone`): set by the proxy, which reads streams with `next_data` only.
        self.relay_alone = False
        self.policy = policy
        self.pipeline = pipeline
        self.verification = verification
        self.clock = clock
        self.paths = PathResolver(self.target, verification, self.draft)
        #: The timeout of every call that sets none (`with_options(timeout=)`): bounds the whole call.
        self.request_timeout: Any = not_given
        # `model=` on a call names another model on the target's server: its own client view and
        # path memory, sharing the connection pool.
        self._by_model: OrderedDict[str, tuple[RoleClient, PathResolver]] = OrderedDict()
        #: The fallbacks for a failing role already logged (`degraded.py`); copies of the client share it.
        self.warnings = FallbackWarnings()

    def warm(self) -> None:
        """Load now what the first requests would otherwise load on the event loop, stalling every
        stream in flight and adding to the first answer's time: the suffix index's tokenizer (0.26 s of
        CPU), the price table, and each role's HTTP client (its TLS context and HTTP modules, 0.05 s).
        Best effort: what fails here fails again, reported, in the request that needs it."""
        with contextlib.suppress(Exception):
            if self.learning:
                load_tokenizer()
            for role in (self.target, self.draft):
                if role is not None:
                    call_cost(role.endpoint, prompt_tokens=1, completion_tokens=1)
                    role.sdk  # noqa: B018 - built now, once

    async def prepare(self, meter: Meter) -> None:
        """Probe the target now if choosing a path will need it (see `PathResolver.prepare`), metering
        its calls in `meter`: no request's statistics will carry them."""
        with contextlib.suppress(Exception):
            await self.paths.prepare(meter)

    def target_for(self, model: str) -> tuple[RoleClient, PathResolver]:
        if model == self.target.endpoint.model:
            return self.target, self.paths
        if model not in self._by_model:
            role = RoleClient("target", replace(self.target.endpoint, model=model, name=None), sleep=self.target.sleep, clock=self.clock)
            role.share_connections(self.target)
            self._by_model[model] = (role, PathResolver(role, self.verification, self.draft))
            _bound(self._by_model)
        self._by_model.move_to_end(model)
        return self._by_model[model]

    def suffix_for(self, model: str) -> SuffixIndex:
        if model == self.target.endpoint.model:
            return self.suffix_index
        if model not in self._suffix_by_model:
            self._suffix_by_model[model] = SuffixIndex(max_tokens=self.suffix_index.max_tokens)
            _bound(self._suffix_by_model)
        self._suffix_by_model.move_to_end(model)
        return self._suffix_by_model[model]

    def learn(self, context: Context, text: str, model: str) -> None:
        """A request finished with `text`: the suffix index of its model remembers it (and
        `on_learn`, when set, hears which tokens it took: the proxy tells its other workers)."""
        if self.learning:
            tokens = learn(self.suffix_for(model), context, text)
            if self.on_learn is not None:
                self.on_learn(model, tokens)

    def engine(
        self, prediction: str | None = None, model: str | None = None, context: Context | None = None, max_tokens: int = 0
    ) -> Engine:
        target, paths = self.target_for(model or self.target.endpoint.model)
        drafter = self.drafter
        if model is not None and model != self.target.endpoint.model:
            drafter = with_index(drafter, self.suffix_for(model))
        if prediction:
            if isinstance(drafter, CombinedDrafter):
                drafter = drafter.with_drafters([PredictionDrafter(prediction=prediction), *drafter.drafters])
            else:
                drafter = CombinedDrafter([PredictionDrafter(prediction=prediction), *([drafter] if drafter else [])])
        policy = self.policy
        watch = getattr(policy, "watch_load", None)  # an optional hook, not in the `DraftLengthPolicy` protocol
        if watch is not None:
            watch(target.load, self.draft.load if self.draft is not None else None)
        seeded_drafter: Drafter | None = None
        if context is not None and context.seed is not None and not context.sampling.greedy and drafter is not None:
            # Where the drafts decide the draws (echo, prompt logprobs), drafts learnt from traffic would
            # change a seed's text between calls: those paths draft without them (the engine chooses once
            # the path is known). Paths that keep the target's picks give a seed one text whatever the drafts.
            seeded_drafter = without_suffix(drafter) if indexes(drafter) else drafter
            if isinstance(seeded_drafter, CombinedDrafter):
                seeded_drafter = seeded_drafter.unlearnt()
        if context is not None and drafter is not None and indexes(drafter):
            index = self.suffix_for(model or self.target.endpoint.model)
            drafter, policy = gate_free_drafts(drafter, policy, context, index, max_tokens)
        return Engine(
            target=target,
            paths=paths,
            drafter=drafter,
            draft_meter_endpoint=self.draft,
            policy=policy,
            clock=self.clock,
            pipeline=self.pipeline,
            seeded_drafter=seeded_drafter,
            seeded_policy=self.policy if seeded_drafter is not None else None,
            relay_alone=self.relay_alone,
            warnings=self.warnings,
        )


def build_drafter(choice: str | Drafter, draft: RoleClient | None, index: SuffixIndex, *, paid_max_length: int | None = None) -> Drafter | None:
    if not isinstance(choice, str):
        return choice
    if choice == "model":
        if draft is None:
            raise ConfigurationError("drafter='model' needs a draft Endpoint")
        return ModelDrafter(draft)
    if choice == "lookup":
        return LookupDrafter()
    if choice == "suffix":
        return SuffixDrafter(index)
    if choice == "auto":
        free: list[Drafter] = [SuffixDrafter(index), LookupDrafter()]
        return CombinedDrafter([*free, ModelDrafter(draft)] if draft is not None else free, paid_max_length=paid_max_length)
    raise ConfigurationError(f"drafter must be 'auto', 'model', 'lookup', 'suffix' or a drafter object, got {choice!r}")


def acceptance_rule(mode: Any, threshold: Any, epsilon: Any, delta: Any) -> AcceptanceRule:
    try:
        return AcceptanceRule(mode=mode, threshold=threshold, epsilon=epsilon, delta=delta)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def build_policy(choice: str | DraftLengthPolicy, k: int) -> DraftLengthPolicy:
    fixed = FixedDraftLength(k)  # validates k either way
    if not isinstance(choice, str):
        return choice
    if choice == "fixed":
        return fixed
    if choice == "adaptive":
        return AdaptiveDraftLength(start_length=k, max_length=max(10, k))  # free drafts: up to max(32, k)
    raise ConfigurationError(f"policy must be 'adaptive', 'fixed' or a policy object, got {choice!r}")
