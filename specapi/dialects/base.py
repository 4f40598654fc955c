"""What every native (token-id) dialect offers, and the records it reads responses into.

A native dialect sends token ids instead of text: the target scores and continues exactly the tokens
it generated, so it never reads its own output back with other token boundaries. Each server family
spells this differently (llama.cpp's `/completion`, SGLang's `/generate`, vLLM's token-id prompts on
`/v1/completions`); the engine and the verifier only see `Pick`, `Generated` and the protocol below.

Malformed responses are translated here, in `reading`, into the role's `MalformedResponseError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..transport._calls import Meter, RoleClient
from ..core.alignment import Listed
from ..core.scoring import PrefixCache

__all__ = ["UNREADABLE", "Listed", "Pick", "Generated", "NativeDialect", "ChatTokenizing", "PromptScoring", "SampledBatches", "SampledStep", "count", "reading", "rendered_bytes", "server_root", "spelling"]


@dataclass(frozen=True)
class Pick:
    """The target's next token after one prompt: its id and bytes, or the end of the text (`end`).
    `data` is None when the server did not show the token's bytes."""

    id: int | None
    data: bytes | None
    end: bool = False
    prompt_tokens: int | None = None
    #: Tokens the server counts for this answer that are no text (its end-of-text token, if counted).
    uncounted: int = 0
    #: With the caller's logprobs asked: the token as the server rendered it in its logprobs, its
    #: logprob, and its top entries in the server's order (`Listed`). None where not asked or not shown.
    token: str | None = None
    logprob: float | None = None
    listed: Listed | None = None


@dataclass(frozen=True)
class Generated:
    """What the target generated from a token-id prompt: ids (None when the server did not list them;
    vLLM lists the token that ended the text among them) and the text's bytes, why it stopped, and what
    it was billed."""

    ids: tuple[int, ...] | None
    data: bytes
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int
    #: Generated tokens left out of `ids`, `data` and `completion_tokens` (see `PlainStep.held_back`).
    held_back: int = 0
    #: The choice's completions `logprobs` object, where the caller's logprobs were asked.
    logprobs: Any = None


@dataclass(frozen=True)
class SampledStep:
    """One position of a chain the draft sampled: the id it drew, that id's log-probability, and the ids
    the server listed at the position with theirs (as the server reports them: raw, before temperature,
    on vLLM). A log-probability is None where the server showed none."""

    id: int
    logprob: float | None
    listed: tuple[tuple[int, float], ...] = ()


class NativeDialect(Protocol):
    """A server family's token-id API, for one role's endpoint."""

    name: str
    #: Greedy next tokens for many prompts in one request (else one request per prompt, concurrently).
    batches: bool
    #: Unseeded sampled next tokens in one request too: the server draws each prompt's token
    #: independently, and `SampledBatches` reads a drawn token's bytes where its answer hid them.
    batches_sampled: bool
    #: Lists the distributions after its sampler chain (`processed_next`, `processed_draft`).
    lists_processed: bool
    #: Renders and tokenizes a chat's messages as its chat endpoint would (`ChatTokenizing`).
    tokenizes_chat: bool
    #: Scores a whole token-id prompt in one request and reports its prefix cache (`PromptScoring`).
    scores_prompts: bool
    #: Its picks and generations carry the caller's logprobs as the target alone renders them.
    carries_logprobs: bool

    async def tokenize(
        self, client: RoleClient, text: str, meter: Meter, *, special: bool, options: Mapping[str, Any] | None = None
    ) -> list[tuple[int, bytes | None]]:
        """The text's token ids, each with its bytes where the server shows them (`options`: the SDK's
        request options of the request whose prompt this is)."""
        ...

    async def next_tokens(
        self, client: RoleClient, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any]
    ) -> list[Pick]: ...

    async def generate(
        self,
        client: RoleClient,
        ids: Sequence[int],
        fields: Mapping[str, Any],
        max_tokens: int | None,
        stop: tuple[str, ...],
        meter: Meter,
        *,
        options: Mapping[str, Any],
        stream: bool = False,
        whole_characters: bool = False,
    ) -> Generated:
        """The target alone continues `ids`; `stream` renders the text as the server streams it."""
        ...


class SampledBatches(NativeDialect, Protocol):
    """A dialect whose `batches_sampled` is True: it drafts on ids (its most likely ids with alternatives,
    and sampled chains), and detokenizes."""

    async def ids_draft(
        self, client: RoleClient, ids: Sequence[int], k: int, fields: Mapping[str, Any], alternatives: int, meter: Meter, *, options: Mapping[str, Any]
    ) -> list[tuple[int, tuple[int, ...]]]:
        """The draft's tokens after `ids` (as the fields ask), each with its `alternatives` next most likely ids."""
        ...

    async def sampled_drafts(
        self, client: RoleClient, ids: Sequence[int], k: int, fields: Mapping[str, Any], n: int, listed: int, meter: Meter, *, options: Mapping[str, Any]
    ) -> list[tuple[SampledStep, ...]]:
        """`n` chains of up to `k` ids the draft samples after `ids` (as the fields ask), in one request,
        each position with the `listed` ids the draft found most likely there."""
        ...

    async def detokenize(self, client: RoleClient, ids: Sequence[int], meter: Meter) -> str:
        """The server's rendering of `ids` together (special tokens by name, U+FFFD for bytes that make no
        character)."""
        ...


class ChatTokenizing(NativeDialect, Protocol):
    """A dialect whose `tokenizes_chat` is True."""

    async def tokenize_chat(
        self, client: RoleClient, messages: Sequence[Mapping[str, Any]], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The ids the server's chat endpoint would run for `messages`, the assistant's turn opened."""
        ...


class PromptScoring(NativeDialect, Protocol):
    """A dialect whose `scores_prompts` is True: one request scores every position of a token-id prompt."""

    async def prefix_cache(self, client: RoleClient) -> PrefixCache | None:
        """The server's prefix cache (block size, on or off); None where the server does not say."""
        ...

    async def scored_next(
        self, client: RoleClient, context: Sequence[int], draft: Sequence[int], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any]
    ) -> list[Pick]:
        """The target's greedy picks after `context + d1..dj` for j = 0..K, from one scored prompt."""
        ...


#: What reading an answer raises when the answer lacks or contradicts a field (`WireError` is a ValueError).
UNREADABLE = (KeyError, IndexError, TypeError, ValueError, AttributeError)


@contextlib.contextmanager
def reading(client: RoleClient, what: str) -> Iterator[None]:
    """Turn a response that lacks or contradicts the fields read from it into the role's
    `MalformedResponseError`: the one mapping of malformed answers, for every dialect and format."""
    try:
        yield
    except UNREADABLE as exc:
        raise client.malformed(f"{what} response is unreadable ({type(exc).__name__}: {exc})") from exc


def server_root(client: RoleClient) -> str:
    """The server's root URL (native APIs live beside `/v1`, not under it)."""
    return client.base_url.rstrip("/").removesuffix("/v1")


def spelling(data: bytes) -> str:
    """A token as specapi spells it (`alignment.token_bytes` reads it back): its text when its bytes
    are whole UTF-8, else `bytes:\\x..`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)
    return text


def count(value: Any) -> int | None:
    """A token count as a server reported it: an integer, else None (absent, null or malformed)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rendered_bytes(text: Any) -> bytes | None:
    """A server's rendering of generated text as bytes; None when the rendering lost them (U+FFFD
    stands where a character was left unfinished)."""
    if not isinstance(text, str) or "\ufffd" in text:
        return None
    return text.encode("utf-8")
