"""Choosing the verification path for a request: fixed by the user, or `auto` from a probe.

A path is either round-based (a `Verifier`: echo, prompt-logprobs, prefill-fanout) or whole-answer
(Predicted Outputs, prefix match: the target generates everything itself). Paths a target refused at
run time are remembered, so later requests of the client go straight to something that works. A refusal
counts only where the verification shape caused it: the same request's plain form was accepted (a
caller's bad parameter is refused both ways, and is the caller's error alone), on two requests.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from ..transport._calls import Meter, RoleClient
from ..transport._exceptions import ConfigurationError, EndpointError
from ..dialects.openai import CONTINUE_FINAL_MESSAGE, Prefill
from .fanout import PrefillFanoutVerifier
from ..dialects import native_dialect
from .probe import Capabilities, cached_probe, cached_server_facts, choose_verification
from .tokenlevel import TargetFacts, TokenIdVerifier
from .verifiers import ChatPromptLogprobsVerifier, EchoVerifier, Verifier
from .whole import PredictedOutputsPath, PrefixMatchPath

#: The paths on which the target writes the whole answer itself, given a draft (see whole.py).
WholeAnswerPath = PredictedOutputsPath | PrefixMatchPath

__all__ = ["VERIFICATIONS", "VerificationPath", "PathResolver"]

VERIFICATIONS = ("auto", "token-ids", "echo", "prompt-logprobs", "prefill-fanout", "predicted-outputs", "prefix-match", "none")

#: Refusals of the verification shape (each on a request whose plain form the target accepted) that
#: write a path off: one may be a fluke of one request (a prompt the shape cannot carry), two are not.
REFUSALS_TO_LEARN = 2

#: A prompt this long (in characters, about 1,000 tokens) is verified in token ids where the target
#: offers both: one-token calls read the prefix cache, where echo's prompt logprobs re-prefill the whole
#: context every round (vLLM; SGLang's input logprobs bypass its radix cache likewise).
LONG_CONTEXT_CHARS = 4000

#: The round paths that send the target text (the context, and the draft after it): it re-tokenizes it.
TEXT_PATHS = ("echo", "prompt-logprobs", "prefill-fanout")


@dataclass(frozen=True)
class VerificationPath:
    """How a request is verified: a round path (`verifier`) or a whole-answer one (`whole`)."""

    name: str
    verifier: Verifier | None = None  # round-based
    whole: WholeAnswerPath | None = None  # whole-answer
    raw_logprobs: bool | None = None
    note: str | None = None  # why this path (e.g. what auto found, or what was refused)
    prefill: Prefill = Prefill()
    max_logprobs: int | None = None  # the longest top-k list the target accepted when probed


class PathResolver:
    def __init__(self, target: RoleClient, verification: str, draft: RoleClient | None = None) -> None:
        if verification not in VERIFICATIONS:
            raise ConfigurationError(f"verification must be one of {', '.join(VERIFICATIONS)}; got {verification!r}")
        self.target = target
        self.draft = draft
        self.verification = verification
        self.capabilities: Capabilities | None = None
        #: What a forced path that skips the probe learnt of the target's server (see `known`).
        self.facts: Capabilities | None = None
        self.refused: dict[bool, str] = {}  # chat? -> reason
        self._strikes: dict[bool, int] = {}  # unreadable answers in a row
        self._refusals: dict[bool, int] = {}  # confirmed refusals of the shape since the last success
        self._lock = asyncio.Lock()
        #: What token-id verification learns of the target once (tokenizer shared with the draft, prefix cache).
        self._token_facts = TargetFacts()

    def prefill(self) -> Prefill:
        caps = self.capabilities
        if caps is None or not caps.chat_prefill:
            return Prefill()
        return Prefill(style=caps.prefill_style or CONTINUE_FINAL_MESSAGE, echoes_prefix=caps.prefill_echoes_prefix)

    def _build(self, name: str, chat: bool) -> VerificationPath:
        path = self._build_path(name, chat)
        max_logprobs = self.capabilities.max_logprobs if self.capabilities and not chat else None
        return replace(path, prefill=self.prefill(), max_logprobs=max_logprobs)

    def _build_path(self, name: str, chat: bool) -> VerificationPath:
        raw = self.capabilities.logprobs_raw if self.capabilities else None
        if name == "token-ids":
            dialect = native_dialect(self.capabilities.server if self.capabilities else None)
            if dialect is None or (self.capabilities is not None and not self.capabilities.token_ids):
                return VerificationPath("none", note="token-id verification needs a server whose native API takes token ids (llama.cpp, vLLM, SGLang); the target alone generated")
            window = self.capabilities.context_window if self.capabilities is not None else None
            verifier = TokenIdVerifier(self.target, dialect, draft_client=self.draft, context_window=window, facts=self._token_facts)
            if chat and not verifier.verifies_chat:
                fallback = choose_verification(self.capabilities, chat=True) if self.capabilities else "none"
                path = self._build_path(fallback, chat) if fallback != "token-ids" else VerificationPath("none")
                return replace(path, note=f"token ids verify completions here; chat went to {path.name}")
            return VerificationPath(name, verifier=verifier)
        if name == "echo":
            if chat:
                return VerificationPath("none", note="echo verification scores completions only; chat went to the target alone")
            return VerificationPath(name, verifier=EchoVerifier(self.target), raw_logprobs=raw)
        if name == "prompt-logprobs":
            if not chat:
                return VerificationPath("echo", verifier=EchoVerifier(self.target), raw_logprobs=raw)
            return VerificationPath(name, verifier=ChatPromptLogprobsVerifier(self.target), raw_logprobs=raw)
        if name == "prefill-fanout":
            return VerificationPath(name, verifier=PrefillFanoutVerifier(self.target, prefill=self.prefill()))
        if name == "predicted-outputs":
            if not chat:
                return VerificationPath("none", note="Predicted Outputs exist for chat only; completions went to the target alone")
            return VerificationPath(name, whole=PredictedOutputsPath(self.target))
        if name == "prefix-match":
            return VerificationPath(name, whole=PrefixMatchPath(self.target))
        return VerificationPath("none")

    async def prepare(self, meter: Meter) -> None:
        """Probe now, before any request waits for it (a server's startup), where choosing a path will
        need it. A failed probe is left to the first request, which probes again and reports."""
        if self.verification in ("auto", "token-ids", "prefill-fanout"):
            await self._probe(meter)
        if self.verification != "none":
            await self._learn_facts()

    @property
    def known(self) -> Capabilities | None:
        """What is known of the target's server: the probe's findings, or a forced path's server facts
        (its sampling defaults, default limit and context window); None before either was learnt."""
        return self.capabilities if self.capabilities is not None else self.facts

    async def _learn_facts(self) -> None:
        """A path forced without probing still ends as the target would: learn the server's defaults and
        window from its GETs (unbilled, once per endpoint and process). Unanswered: left unknown."""
        if self.capabilities is None and self.facts is None:
            async with self._lock:
                if self.facts is None:
                    try:
                        self.facts = await cached_server_facts(self.target)
                    except EndpointError:
                        pass

    async def probed(self, meter: Meter) -> Capabilities | None:
        """What is known of the target, probing it first where nothing is (None: the probe failed)."""
        if self.known is None:
            await self._probe(meter)
        return self.known

    async def _probe(self, meter: Meter) -> EndpointError | None:
        """Probe the target once (later callers wait for the first); the failure if it failed."""
        async with self._lock:
            if self.capabilities is None:
                try:
                    self.capabilities = await cached_probe(self.target, meter)
                except EndpointError as exc:
                    return exc
        return None

    async def resolve(
        self, chat: bool, meter: Meter, *, context_chars: int = 0, greedy: bool = True, needs_lists: bool = False, logprobs: bool = False
    ) -> VerificationPath:
        """The path for a request. `needs_lists`: its acceptance rule reads the target's top lists (a
        lossy rule the caller opted into), so a sampled request keeps the list paths. `logprobs`: the
        caller asked for the tokens' logprobs, which the scoring paths (echo, prompt logprobs) and, greedy, vLLM's token ids carry."""
        if chat in self.refused:
            return VerificationPath("none", note=self.refused[chat], prefill=self.prefill())
        if self.verification == "none":
            return VerificationPath("none", note="verification='none': the target alone", prefill=self.prefill())
        sampled = not greedy and not needs_lists
        if sampled and not logprobs and self.verification in TEXT_PATHS:
            # (The caller's logprobs of a sampled answer come from the text paths' scores alone.)
            on_ids = await self._on_ids(chat, meter)
            if on_ids is not None:
                return on_ids
        if self.verification != "auto" and not (chat and self.verification == "prefill-fanout") and self.verification != "token-ids":
            await self._learn_facts()
            return self._build(self.verification, chat)
        # Auto needs the probe to choose; chat fan-out needs it to know how the target continues an
        # assistant message (vLLM's flags, or llama.cpp's echoed prefix).
        failure = await self._probe(meter)
        if failure is not None:
            # Probing hit transient failures: use the common path now, probe again next time.
            default = self.verification if self.verification != "auto" else ("prompt-logprobs" if chat else "echo")
            path = self._build(default, chat)
            return replace(path, raw_logprobs=None, note=f"probe failed ({failure}); tried {default}")
        if self.verification != "auto":
            return self._build(self.verification, chat)
        name = choose_verification(self.capabilities, chat=chat)
        caps = self.capabilities
        if caps.server == "vllm" and caps.token_ids and not needs_lists and (greedy or not logprobs):
            # The target's own ids, never text it would read back with other token boundaries; a greedy
            # round checks the draft by the scoring that recomputes least (scoring.py, docs/verification.md),
            # and each kept token's logprobs entry, where the caller asked, is the target's own there.
            name = "token-ids"
        elif name == "echo" and caps.token_ids and (sampled or (greedy and context_chars >= LONG_CONTEXT_CHARS)):
            # Sampled: top lists of 20 rarely cover a tempered distribution, so echo would hand most
            # positions to the target; the target's own picks need no coverage (docs/verification.md).
            name = "token-ids"
        elif name == "prompt-logprobs" and sampled and caps.chat_prefill and caps.chat:
            name = "prefill-fanout"  # the same reason, for chat: the target's picks after a continued message
        path = self._build(name, chat)
        return replace(path, note=f"auto chose {path.name} from the target's capabilities")

    async def _on_ids(self, chat: bool, meter: Meter) -> VerificationPath | None:
        """A sampled request forced onto a path that sends text, where the target takes this request as
        token ids: the token-id path, which never has the target re-read its text (None: the forced path
        stays). Text the target re-tokenizes with other boundaries than it generated changes what it
        samples next, and a sampled answer cannot be written again without biasing it (a greedy one is:
        the forced path keeps greedy requests). The server's GETs tell whether it is one whose native API
        takes ids (vLLM, llama.cpp, SGLang); only then is it probed, once, to know it does."""
        await self._learn_facts()
        known = self.known
        if known is None or native_dialect(known.server) is None or await self._probe(meter) is not None:
            return None
        path = self._build("token-ids", chat)  # "none" where the probe found no token ids, or chat on other paths
        if path.name != "token-ids":
            return None
        return replace(path, note=f"sampled on token ids, not {self.verification}: a text context would be re-tokenized by the target, which biases what it samples")

    def refuse(self, chat: bool, reason: str, *, definite: bool) -> bool:
        """Count a failure of the path; True when it is now written off.

        `definite`: the target refused the verification request (HTTP 400) and then accepted the same
        request in its plain form, so the shape is at fault, not the caller's parameters (the engine
        calls this only after that plain request). Two of them write the path off. Otherwise an
        unreadable answer: three in a row do (one may be a network glitch). A path guessed because
        probing failed is not written off: the next request probes again and chooses properly."""
        if self.capabilities is None and self.verification == "auto":
            return False
        if definite:
            count = self._refusals[chat] = self._refusals.get(chat, 0) + 1
            learnt = count >= REFUSALS_TO_LEARN
        else:
            count = self._strikes[chat] = self._strikes.get(chat, 0) + 1
            learnt = count >= 3
        if learnt and chat not in self.refused:
            self.refused[chat] = reason
            return True
        return False

    def succeeded(self, chat: bool) -> None:
        self._strikes[chat] = 0
        self._refusals[chat] = 0
