"""Interpolated n-gram language models over real ``cl100k_base`` tokens.

A model answers one question: given the token ids so far, how likely is each next token? Everything the
simulated provider reports (logprobs, top lists, greedy and sampled text) derives from that answer, so
generation, echo scoring and top lists always agree.

The estimate, built from the offline corpus (``corpus.py``) in a fraction of a second:

* **n-gram**, per domain (code, prose): Witten-Bell interpolation of the counts seen after the last
  ``order - 1`` tokens with the estimate for one token less; level weight ``n(h) / (n(h) + beta * distinct(h))``.
  The domains are mixed by a naive-Bayes posterior over the last ``domain_window`` tokens, so a model that
  is writing prose keeps writing prose rather than drifting into code at the first unseen context.
* **unigram**: add-alpha counts, shared by the domains, for whatever weight the levels leave.
* **copy**: like the induction behaviour of real models, tokens that followed earlier occurrences of the
  context's longest repeated suffix (at least ``copy_min_match`` tokens) get a weight growing with the match
  length, up to ``copy_max``: boilerplate and edits of the prompt become predictable (what prompt-lookup
  drafting exploits). A token that would start a third consecutive pass over a span is damped
  (``loop_penalty``): a model seeing only a few tokens back would otherwise soon cycle when greedy.
* **noise**: the model's idiosyncrasy, a factor ``exp(noise * z)`` with ``z`` fixed per (seed, position, last
  three tokens, candidate). It flips choices where the distribution is flat (prose) and rarely where it is sharp (code).
* **sharpness**: the probability each token has above the tail is raised to the power ``sharpness`` and
  renormalised (``_sharpen``). Back-off smoothing leaves an n-gram much flatter than a trained model, which
  matters only when sampling: with no sharpening the target's most likely token held 0.55 of the mass on
  average along its own samples of code at temperature 1, and a target draw kept the draft's most likely
  token (vLLM's argmax drafts) at 0.46 a position against 0.69 for the overlap of the two distributions
  (sampled drafts, the full rejection sampler): 125% more accepted length for the latter, where real
  pairs measured 1–11% (``_SHARPNESS``). A power keeps every ranking, so greedy text is unchanged.
* **tail**: ``tail_mass`` spread uniformly over the whole tokenizer (``UNIVERSE_SIZE`` tokens), so every
  token has a nonzero probability.
* **end of turn**: in a turn of the chat template (after its last role marker, such as ``<|assistant|>``),
  the end of text takes a weight rising from 0 at ``turn_end_from`` tokens into the turn to 1 at
  ``turn_end_by`` (the rest scaled down to make room), so a chat answer ends by itself as a chat
  model's does: greedy by halfway, sampled soon after ``turn_end_from``. The documents the n-grams learn
  from are long, and without it a chat request that sets no limit ran to the context window (8,180
  tokens, 206 s on the LAN profile).

A distribution is held sparsely (``Mixture``): the tokens the parts above name, with their probabilities,
and a scale for every other token (``tail_prob + scale * unigram``). Every path (one token, top-k, the whole
vocabulary, sampling) reads the same numbers, and logs are taken with ``math.log`` on single values, so
results agree bit for bit. Ties are broken by the lowest token id. Only the corpus's tokens (the *active
vocabulary*, a few thousand) have dense arrays.

Target and draft differ in order, smoothing, noise and prose documents (they share all the code but only
a quarter of the prose): greedy agreement is high on code and boilerplate, low on prose.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .corpus import EOS_TOKEN_ID, UNIVERSE_SIZE, load_corpus
from .scoretable import ScoreTable

__all__ = [
    "MODEL_SPECS",
    "Mixture",
    "ModelSpec",
    "NGramModel",
    "ScoredPosition",
    "get_model",
    "model_names",
]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """How to build one simulated model.

    ``order``: n of the n-gram (the context is ``order - 1`` tokens; at most 4). ``tier``: ``"target"``
    (large) or ``"draft"`` (small); latency profiles time and price models by tier. ``documents``: which
    training documents, as ``(kind, every, offset)`` triples (see ``Corpus.stream``). ``beta``: Witten-Bell weight
    of unseen continuations (higher = smoother). ``unigram_alpha``: add-alpha count of the unigram level.
    ``copy_min_match`` / ``copy_max``: shortest repeated suffix that triggers copying, and the copy weight's
    ceiling (0 turns copying off). ``noise`` / ``seed``: scale and seed of the idiosyncrasy factor
    ``exp(noise * z)`` (``z`` of unit variance, fixed per context and token) on the tokens the other parts name. ``loop_penalty``: factor on a token that would
    start a third consecutive pass over a span of two or more tokens (1 = off). ``domain_window``: tokens
    read to weigh the domains (0 = pool all documents in one n-gram). ``tail_mass``: probability spread
    uniformly over every token. ``sharpness``: the power (1..4) each token's probability above the tail is
    raised to before renormalising (1 = the smoothed counts as they are; greedy text is the same at any). ``turn_end_from`` / ``turn_end_by``: where in an assistant's turn the end of
    text starts taking weight, and where it has all of it (``turn_end_by = 0`` turns it off).
    """

    name: str
    order: int
    tier: str
    documents: tuple[tuple[str, int, int], ...] = (("code", 1, 0), ("prose", 1, 0))
    beta: float = 1.0
    unigram_alpha: float = 0.5
    copy_min_match: int = 2
    copy_max: float = 0.9
    noise: float = 0.0
    seed: int = 0
    loop_penalty: float = 0.02
    domain_window: int = 32
    tail_mass: float = 1e-5
    sharpness: float = 1.0
    turn_end_from: int = 128
    turn_end_by: int = 640
    description: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.order <= 4:
            raise ValueError("order must be in 1..4")
        if self.tier not in ("target", "draft"):
            raise ValueError("tier must be 'target' or 'draft'")
        if not 0.0 < self.tail_mass < 1.0:
            raise ValueError("tail_mass must be in (0, 1)")
        if not 0.0 <= self.copy_max < 1.0:
            raise ValueError("copy_max must be in [0, 1)")
        if not 1.0 <= self.sharpness <= 4.0:
            raise ValueError("sharpness must be in [1, 4]")
        if self.turn_end_by and not 0 <= self.turn_end_from < self.turn_end_by:
            raise ValueError("turn_end_from must be in [0, turn_end_by)")


_TARGET_DOCUMENTS = (("code", 1, 0), ("prose", 2, 0))
# How much sharper than their smoothed counts the models are (``ModelSpec.sharpness``): with it, a draft's
# most likely token kept by the target's draw (vLLM's argmax drafts) against the full rejection sampler's
# overlap (sampled drafts) is 4.8% and 8.1% shorter in accepted length on lan-code at temperature 0.7
# and 1.0 (``benchmarks/sampled_acceptance.py``), where real pairs measured 1.7–7.6% and 0.7–11.1%
# (llama.cpp PR #27694: Llama-3.1-8B with 3B drafts, Qwen3.5/3.6 with MTP heads); with 1 it was 20% and 125%.
_SHARPNESS = 1.75
# The draft shares the code and half of the target's prose: it follows code, and prose much less.
_DRAFT_DOCUMENTS = (("code", 1, 0), ("prose", 2, 1), ("prose", 4, 0))

MODEL_SPECS: Mapping[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="sim-target",
            order=4,
            tier="target",
            documents=_TARGET_DOCUMENTS,
            noise=0.5,
            sharpness=_SHARPNESS,
            description="large: 4-gram on all the code and half of the prose",
        ),
        ModelSpec(
            name="sim-draft",
            order=3,
            tier="draft",
            documents=_DRAFT_DOCUMENTS,
            beta=1.5,
            copy_max=0.8,
            noise=0.5,
            seed=1,
            sharpness=_SHARPNESS,
            description="small: 3-gram on all the code, the other half of the prose and a quarter of the target's",
        ),
        ModelSpec(
            name="sim-draft-small",
            order=2,
            tier="draft",
            documents=_DRAFT_DOCUMENTS,
            beta=2.0,
            unigram_alpha=1.0,
            copy_max=0.8,
            noise=1.0,
            seed=2,
            sharpness=_SHARPNESS,
            description="smaller: 2-gram on the same documents as sim-draft, noisier",
        ),
        ModelSpec(
            name="sim-target-clone",
            order=4,
            tier="draft",
            documents=_TARGET_DOCUMENTS,
            noise=0.5,
            sharpness=_SHARPNESS,
            description="a draft identical to sim-target: greedy drafts are always accepted",
        ),
    )
}


def model_names() -> list[str]:
    """Names of the built-in models."""
    return list(MODEL_SPECS)


@dataclass(frozen=True)
class Mixture:
    """One next-token distribution, held sparsely.

    Tokens in ``ids`` (sorted) have probability ``probs``; every other token ``x`` has
    ``tail_prob + scale * unigram(x)``. Each path (one token, candidates, whole vocabulary) reads these same
    numbers, so they agree bit for bit.
    """

    ids: np.ndarray
    probs: np.ndarray
    scale: float
    tops: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, compare=False, repr=False)
    """Top-k lists already taken from this distribution, by k (``NGramModel._top`` fills it)."""


@dataclass(frozen=True, slots=True)
class ScoredPosition:
    """One scored position: the actual token's logprob and rank, and the top alternatives."""

    token_id: int
    logprob: float
    rank: int | None
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


class _Level:
    """Counts after every context of one length, in a CSR layout (contexts keyed in active indices)."""

    __slots__ = ("rows", "starts", "next_ids", "counts", "totals", "distinct")

    def __init__(self, local: np.ndarray, length: int, vocab_ids: np.ndarray) -> None:
        vocab = len(vocab_ids)
        n = len(local)
        key = np.zeros(n - length, dtype=np.int64)
        for back in range(1, length + 1):  # the most recent token is the lowest digit
            key += local[length - back : n - back] * vocab ** (back - 1)
        pairs, counts = np.unique(key * vocab + local[length:], return_counts=True)
        keys, starts = np.unique(pairs // vocab, return_index=True)
        self.rows: dict[int, int] = dict(zip(keys.tolist(), range(len(keys))))
        self.next_ids = vocab_ids[pairs % vocab]  # sorted within a row, as active order = id order
        self.counts = counts.astype(np.float64)
        self.totals: list[float] = np.add.reduceat(self.counts, starts).tolist()
        ends = np.append(starts[1:], len(pairs))
        self.distinct: list[int] = (ends - starts).tolist()
        self.starts: list[int] = np.append(starts, len(pairs)).tolist()


@dataclass(frozen=True)
class _Domain:
    """The n-gram levels of one kind of training text, and what it takes to recognise that text."""

    levels: list[_Level]
    log_unigram: np.ndarray  # log(p_domain / p_pooled) per token id
    log_prior: float


class NGramModel:
    """A deterministic next-token model (see the module docstring). Contexts are token-id sequences."""

    def __init__(self, spec: ModelSpec, streams: Mapping[str, np.ndarray], vocab_ids: np.ndarray) -> None:
        self.spec = spec
        self.name = spec.name
        self.vocab_ids = vocab_ids  # sorted ids of the active vocabulary
        self.vocab_size = len(vocab_ids)
        self.tail_prob = spec.tail_mass / UNIVERSE_SIZE
        self._keep = 1.0 - spec.tail_mass
        self._local = np.full(EOS_TOKEN_ID + 1, -1, dtype=np.int64)
        self._local[vocab_ids] = np.arange(self.vocab_size)
        local = {kind: self._local[stream] for kind, stream in streams.items()}
        counts = sum(np.bincount(ids, minlength=self.vocab_size) for ids in local.values()).astype(np.float64)
        alpha = spec.unigram_alpha
        self._unigram = (counts + alpha) / (counts.sum() + alpha * self.vocab_size)
        self._unigram_by_id = np.zeros(EOS_TOKEN_ID + 1)
        self._unigram_by_id[vocab_ids] = self._unigram
        self._unigram_rank = vocab_ids[np.lexsort((vocab_ids, -self._unigram))]
        self._unigram_head = np.sort(self._unigram_rank[:_UNIGRAM_HEAD])
        self._zero_head = np.zeros(len(self._unigram_head))
        if spec.domain_window > 0 and len(local) > 1:
            self._domains = [self._domain(ids, counts.sum()) for ids in local.values()]
            self._domain_log_unigram = np.stack([d.log_unigram for d in self._domains])
            self._domain_log_prior = np.array([d.log_prior for d in self._domains])
        else:
            pooled = np.concatenate(list(local.values()))
            self._domains = [_Domain([_Level(pooled, n, vocab_ids) for n in range(1, spec.order)], _NO_PROBS, 0.0)]
        self._complement: np.ndarray | None = None
        self._score_tables: dict[int, ScoreTable] = {}  # by width, made at the first scoring
        self._recent_scores: OrderedDict[int, ScoredPosition] = OrderedDict()  # the newest, as objects, in front
        self._score_lock = threading.Lock()
        self._mixtures: OrderedDict[tuple[int, int], Mixture] = OrderedDict()
        # The Witten-Bell terms of each domain after the last ``order - 1`` tokens (all they depend on).
        self._levels_seen: dict[tuple[int, tuple[int, ...]], tuple[float, list[tuple[float, np.ndarray, np.ndarray]]]] = {}

    def _domain(self, local: np.ndarray, total: float) -> _Domain:
        levels = [_Level(local, length, self.vocab_ids) for length in range(1, self.spec.order)]
        counts = np.bincount(local, minlength=self.vocab_size) + 1.0
        log_unigram = np.zeros(EOS_TOKEN_ID + 1)  # tokens outside the vocabulary say nothing about the domain
        log_unigram[self.vocab_ids] = np.log(counts / counts.sum()) - np.log(self._unigram)
        return _Domain(levels, log_unigram, math.log(len(local) / total))

    def domain_weights(self, context: np.ndarray) -> list[float]:
        """How much each training domain (code, prose) speaks after ``context``: a naive-Bayes posterior
        from the last ``domain_window`` tokens, tempered and kept within [0.05, 0.95]."""
        if len(self._domains) == 1:
            return [1.0]
        window = context[-self.spec.domain_window :]
        scores = (self._domain_log_prior + self._domain_log_unigram[:, window].sum(axis=1) / _DOMAIN_TEMPERATURE).tolist()
        top = max(scores)
        weights = [math.exp(x - top) for x in scores]
        total = sum(weights)
        weights = [min(0.95, max(0.05, w / total)) for w in weights]
        total = sum(weights)
        return [w / total for w in weights]

    def __repr__(self) -> str:
        return f"NGramModel({self.name!r}, order={self.spec.order}, vocab={self.vocab_size})"

    # -- the estimate ---------------------------------------------------------------------------------

    @staticmethod
    def _as_ids(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() > EOS_TOKEN_ID):
            raise ValueError("token id outside the tokenizer")
        return ids

    def mixture(self, context: np.ndarray) -> Mixture:
        """The next-token distribution after ``context`` (an int64 array of token ids).

        A pure function of the context, so the last ``_MIXTURE_CACHE_SIZE`` are kept: a server computes the
        positions of a request once, but the simulator would otherwise compute the same context again for
        each call that names it (a verify call re-scoring the draft's last position, a repeated prompt).
        Keyed by length and a 64-bit hash of the ids, as the score table is.
        """
        key = (len(context), hash(context.tobytes()))
        with self._score_lock:
            found = self._mixtures.get(key)
            if found is not None:
                self._mixtures.move_to_end(key)
                return found
        found = self._compute_mixture(context)
        with self._score_lock:
            self._mixtures[key] = found
            if len(self._mixtures) > _MIXTURE_CACHE_SIZE:
                self._mixtures.popitem(last=False)
        return found

    def _compute_mixture(self, context: np.ndarray) -> Mixture:
        unigram_weight, terms = self._ngram_terms(context)
        copy_weight, copy_ids, copy_counts, loop_ids = self._copy_terms(context)
        if copy_ids.size:
            keep_ngram = 1.0 - copy_weight
            unigram_weight *= keep_ngram
            terms = [(coef * keep_ngram, ids, counts) for coef, ids, counts in terms]
            terms.append((copy_weight / float(copy_counts.sum()), copy_ids, copy_counts))
        # The most frequent tokens are always held sparsely too, so the noise reaches them where the
        # context is unknown and only the unigram level speaks.
        terms.append((0.0, self._unigram_head, self._zero_head))
        terms.append((0.0, loop_ids, np.zeros(loop_ids.size)))
        ids, inverse = _unique_with_inverse(np.concatenate([t[1] for t in terms]))
        mass = np.bincount(inverse, weights=np.concatenate([coef * counts for coef, _, counts in terms]))
        mass += unigram_weight * self._unigram_by_id[ids]
        normaliser = 1.0
        if self.spec.noise > 0.0 or loop_ids.size:
            factor = np.exp(self.spec.noise * _hashed_noise(self._noise_key(context), ids))
            if loop_ids.size:
                factor[np.isin(ids, loop_ids)] *= self.spec.loop_penalty
            adjusted = mass * factor
            normaliser = float(adjusted.sum() - mass.sum()) + 1.0
            mass = adjusted
        scale = self._keep * unigram_weight / normaliser
        probs = self.tail_prob + (self._keep / normaliser) * mass
        if self.spec.sharpness != 1.0:
            probs, scale = self._sharpen(ids, probs, scale)
        ending = self._turn_end_weight(context)
        if ending > 0.0:
            ids, probs, scale = self._with_end_of_text(ids, probs, scale, ending)
        ids.flags.writeable = probs.flags.writeable = False  # shared by every caller of a cached mixture
        return Mixture(ids, probs, scale)

    def _sharpen(self, ids: np.ndarray, probs: np.ndarray, scale: float) -> tuple[np.ndarray, float]:
        """The mass above the tail raised to the power ``sharpness`` and renormalised (the tail unchanged).

        A token held sparsely (``ids``) with mass r above the tail gets r ** s; every other token keeps the
        form ``tail_prob + scale * unigram`` (one scale for all of them, so the sparse form holds), each
        multiplied by m ** (s - 1), m the largest such mass. Every one of them has at most m, so none is
        lifted above a held token it was below, and the most likely token stays the most likely: greedy
        text is the same at every sharpness.
        """
        gamma = self.spec.sharpness
        above = probs - self.tail_prob
        head = self._unigram_rank[: 1 + ids.size]
        if ids.size:
            pos = ids.searchsorted(head)
            pos[pos == ids.size] = 0
            head = head[ids[pos] != head]
        largest = scale * float(self._unigram_by_id[head[0]]) if head.size else 0.0
        lift = largest ** (gamma - 1.0) if largest > 0.0 else 0.0
        held = np.power(above, gamma)
        rest = max(0.0, self._keep - float(above.sum()))  # the mass of the tokens not held, above the tail
        factor = self._keep / (float(held.sum()) + lift * rest)
        return self.tail_prob + factor * held, scale * lift * factor

    def _turn_end_weight(self, context: np.ndarray) -> float:
        """The end of text's share (0..1) after ``context``: 0 outside a turn of the chat template and before
        ``turn_end_from`` tokens into one, then rising linearly to 1 at ``turn_end_by``. A turn starts after
        the last role marker (``<|assistant|>\n``, ``<|user|>\n``, ...), one the model wrote itself too: a
        chat model ends its turn rather than write another's, and if it does, that turn ends in turn."""
        spec = self.spec
        if not spec.turn_end_by or context.size < 3:
            return 0.0
        found = np.flatnonzero(np.isin(context[1:-1], _ROLE_IDS))
        start = -1
        for at in found[::-1].tolist():  # `at` is the marker's first bar: the role's token is at + 1
            if context[at] == _BAR_ID and context[at + 2] == _BAR_ID:
                start = at + 4  # after the marker's ``>\n``: the turn's own tokens
                break
        if start < 0:
            return 0.0
        return min(1.0, max(0.0, (context.size - start - spec.turn_end_from) / (spec.turn_end_by - spec.turn_end_from)))

    def _with_end_of_text(self, ids: np.ndarray, probs: np.ndarray, scale: float, weight: float) -> tuple[np.ndarray, np.ndarray, float]:
        """The distribution with the end of text given ``weight`` of the non-tail mass, the rest scaled to fit."""
        keep = 1.0 - weight
        probs = self.tail_prob + keep * (probs - self.tail_prob)
        scale *= keep
        pos = int(ids.searchsorted(EOS_TOKEN_ID))
        if pos == ids.size or int(ids[pos]) != EOS_TOKEN_ID:
            ids = np.insert(ids, pos, EOS_TOKEN_ID)
            probs = np.insert(probs, pos, self.tail_prob + scale * float(self._unigram_by_id[EOS_TOKEN_ID]))
        probs[pos] += weight * self._keep
        return ids, probs, scale

    def _noise_key(self, context: np.ndarray) -> int:
        # The position is part of the key: the greedy path of a model that sees only a few tokens back
        # would otherwise turn periodic within a few dozen tokens.
        key = (self.spec.seed * 1_000_003 + len(context)) & _MASK64
        for token in context[-3:].tolist():
            key = (key * 1_000_003 + token + 1) & _MASK64
        return key

    def _ngram_terms(self, context: np.ndarray) -> tuple[float, list[tuple[float, np.ndarray, np.ndarray]]]:
        """Witten-Bell terms ``(coef, next ids, counts)`` of every domain, weighted by the domain posterior,
        and the weight left for the unigram level."""
        remaining = 0.0
        terms: list[tuple[float, np.ndarray, np.ndarray]] = []
        recent = tuple(context[max(0, len(context) - self.spec.order + 1) :].tolist())  # all a level looks at
        for index, (domain, weight) in enumerate(zip(self._domains, self.domain_weights(context))):
            key = (index, recent)
            found = self._levels_seen.get(key)
            if found is None:
                found = self._witten_bell(domain.levels, context)
                with self._score_lock:
                    self._levels_seen[key] = found
                    if len(self._levels_seen) > _LEVELS_SEEN_SIZE:
                        del self._levels_seen[next(iter(self._levels_seen))]
            left, domain_terms = found
            remaining += weight * left
            terms.extend((weight * coef, ids, counts) for coef, ids, counts in domain_terms)
        return remaining, terms

    def _witten_bell(
        self, levels: list[_Level], context: np.ndarray
    ) -> tuple[float, list[tuple[float, np.ndarray, np.ndarray]]]:
        found: list[tuple[_Level, int]] = []  # shortest context first
        key = 0
        vocab = self.vocab_size
        for length, level in enumerate(levels, start=1):
            if length > len(context):
                break
            token = int(self._local[context[-length]])
            if token < 0:
                break
            key += token * vocab ** (length - 1)
            row = level.rows.get(key)
            if row is None:
                break  # every longer context contains this unseen one
            found.append((level, row))
        remaining = 1.0
        terms: list[tuple[float, np.ndarray, np.ndarray]] = []
        for level, row in reversed(found):
            total = level.totals[row]
            lam = total / (total + self.spec.beta * level.distinct[row])
            start, end = level.starts[row], level.starts[row + 1]
            terms.append((remaining * lam / total, level.next_ids[start:end], level.counts[start:end]))
            remaining *= 1.0 - lam
        return remaining, terms

    def _copy_terms(self, context: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Copy weight and the tokens (with counts) that followed the longest repeated suffix of ``context``;
        and the tokens that would start a third pass of a span just written twice in a row (a loop)."""
        n = len(context)
        if n < 2:
            return 0.0, _NO_IDS, _NO_PROBS, _NO_IDS
        ends = np.flatnonzero(context[:-1] == context[-1])  # earlier occurrences of the last token
        ends = ends[(ends >= 1) & (context[ends - 1] == context[-2])]  # copies and loops need two tokens
        if not ends.size:
            return 0.0, _NO_IDS, _NO_PROBS, _NO_IDS
        if ends.size <= _FEW_ENDS:
            return self._copy_terms_few(context, ends.tolist())
        width = min(_MAX_COPY_MATCH, n - 1)
        back = np.arange(width)
        where = ends[:, None] - back[None, :]
        inside = where >= 0
        equal = (context[np.where(inside, where, 0)] == context[n - 1 - back][None, :]) & inside
        lengths = np.where(equal.all(axis=1), width, equal.argmin(axis=1))
        distance = n - 1 - ends
        looping = (lengths >= distance) & (distance >= _MIN_LOOP_PERIOD) & (self.spec.loop_penalty < 1.0)
        loop_ids = np.unique(context[ends[looping] + 1]) if looping.any() else _NO_IDS
        lengths = np.where(looping, 0, lengths)
        length = int(lengths.max())
        if self.spec.copy_max <= 0.0 or length < self.spec.copy_min_match:
            return 0.0, _NO_IDS, _NO_PROBS, loop_ids
        ids, counts = np.unique(context[ends[lengths == length] + 1], return_counts=True)
        return self.spec.copy_max * (length - 1) / (length + 1), ids, counts.astype(np.float64), loop_ids

    def _copy_terms_few(self, context: np.ndarray, ends: list[int]) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """``_copy_terms`` for a few earlier occurrences, in plain Python (the arrays cost more than the work)."""
        n = len(context)
        width = min(_MAX_COPY_MATCH, n - 1)
        suffix = context[n - width :].tolist()[::-1]  # the last tokens, most recent first
        loops: set[int] = set()
        best, after = 0, []
        for end in ends:
            earlier = context[max(0, end - width + 1) : end + 1].tolist()[::-1]
            length = 0
            for a, b in zip(earlier, suffix):
                if a != b:
                    break
                length += 1
            distance = n - 1 - end
            if length >= distance and distance >= _MIN_LOOP_PERIOD and self.spec.loop_penalty < 1.0:
                loops.add(int(context[end + 1]))
                length = 0
            if length > best:
                best, after = length, [end]
            elif length == best:
                after.append(end)
        loop_ids = np.array(sorted(loops), dtype=np.int64) if loops else _NO_IDS
        if self.spec.copy_max <= 0.0 or best < self.spec.copy_min_match:
            return 0.0, _NO_IDS, _NO_PROBS, loop_ids
        counts: dict[int, int] = {}
        for token in context[np.array(after) + 1].tolist():
            counts[token] = counts.get(token, 0) + 1
        ids = sorted(counts)
        weight = self.spec.copy_max * (best - 1) / (best + 1)
        return weight, np.array(ids, dtype=np.int64), np.array([counts[i] for i in ids], dtype=np.float64), loop_ids

    def _probs(self, mix: Mixture, ids: np.ndarray) -> np.ndarray:
        """Probabilities of the given token ids."""
        p = self.tail_prob + mix.scale * self._unigram_by_id[ids]
        if mix.ids.size:
            pos = np.searchsorted(mix.ids, ids)
            pos[pos == mix.ids.size] = 0
            hit = mix.ids[pos] == ids
            p[hit] = mix.probs[pos[hit]]
        return p

    def _prob(self, mix: Mixture, token: int) -> float:
        """``_probs`` of one token id (the same arithmetic on Python floats, so the same bits)."""
        ids = mix.ids
        pos = int(ids.searchsorted(token))
        if pos < ids.size and int(ids[pos]) == token:
            return float(mix.probs[pos])
        return self.tail_prob + mix.scale * float(self._unigram_by_id[token])

    def _dense(self, mix: Mixture) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Probabilities of the active vocabulary, plus tokens of ``mix.ids`` outside it: ``(p, ids, p)``."""
        p = self.tail_prob + mix.scale * self._unigram
        local = self._local[mix.ids]
        inside = local >= 0
        p[local[inside]] = mix.probs[inside]
        return p, mix.ids[~inside], mix.probs[~inside]

    def _top(self, mix: Mixture, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` token ids and probabilities, most likely first, ties by lowest id.

        Outside ``mix.ids`` probabilities follow the unigram order, so the candidates are ``mix.ids`` and the
        first ``k`` tokens in unigram order that are not among them.
        """
        if k <= 0:
            return _NO_IDS, _NO_PROBS
        found = mix.tops.get(k)
        if found is None:
            found = mix.tops[k] = self._compute_top1(mix) if k == 1 else self._compute_top(mix, k)
            for array in found:
                array.flags.writeable = False  # kept with the distribution, shared by later callers
        return found

    def _compute_top1(self, mix: Mixture) -> tuple[np.ndarray, np.ndarray]:
        """``_compute_top(mix, 1)`` (greedy's question) without sorting: the most likely of ``mix.ids`` (the
        lowest id among ties, as ids are sorted) against the first token in unigram order outside them."""
        ids = mix.ids
        best = int(mix.probs.argmax()) if ids.size else -1
        head = self._unigram_rank[: 1 + ids.size]
        if ids.size:
            pos = ids.searchsorted(head)
            pos[pos == ids.size] = 0
            head = head[ids[pos] != head]
        outside = int(head[0]) if head.size else -1
        if best >= 0:
            token, prob = int(ids[best]), float(mix.probs[best])
            if outside >= 0:
                other = self.tail_prob + mix.scale * float(self._unigram_by_id[outside])
                if other > prob or (other == prob and outside < token):
                    token, prob = outside, other
        else:
            token, prob = outside, self.tail_prob + mix.scale * float(self._unigram_by_id[outside])
        return np.array([token], dtype=np.int64), np.array([prob])

    def _compute_top(self, mix: Mixture, k: int) -> tuple[np.ndarray, np.ndarray]:
        head = self._unigram_rank[: k + mix.ids.size]
        if mix.ids.size:
            pos = np.searchsorted(mix.ids, head)
            pos[pos == mix.ids.size] = 0
            head = head[mix.ids[pos] != head][:k]
        cands = np.concatenate([mix.ids, head])
        probs = np.concatenate([mix.probs, self.tail_prob + mix.scale * self._unigram_by_id[head]])
        if cands.size > k:
            part = np.argpartition(-probs, k - 1)[:k]
            threshold = probs[part].min()
            part = np.flatnonzero(probs >= threshold)  # keep every tie at the boundary
            cands, probs = cands[part], probs[part]
        order = np.lexsort((cands, -probs))[:k]
        return cands[order], probs[order]

    # -- public API -----------------------------------------------------------------------------------

    def next_distribution(self, context_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Next-token distribution (temperature 1): ``(token ids, probs)`` over the active vocabulary and any
        copied tokens. Every other token has probability ``tail_prob``."""
        return self.distribution_from(self.mixture(self._as_ids(context_ids)))

    def distribution_from(self, mix: Mixture) -> tuple[np.ndarray, np.ndarray]:
        """``next_distribution`` for an already computed mixture."""
        p, extra_ids, extra_p = self._dense(mix)
        if not extra_ids.size:
            return self.vocab_ids.copy(), p
        ids = np.concatenate([self.vocab_ids, extra_ids])
        order = np.argsort(ids, kind="stable")
        return ids[order], np.concatenate([p, extra_p])[order]

    def logprob(self, context_ids: Sequence[int], token_id: int) -> float:
        """Natural-log probability of ``token_id`` after ``context_ids``."""
        self._as_ids([token_id])
        return self.logprob_from(self.mixture(self._as_ids(context_ids)), token_id)

    def top_logprobs(self, context_ids: Sequence[int], k: int) -> list[tuple[int, float]]:
        """The ``k`` most likely next tokens as ``(token id, logprob)``, most likely first."""
        return self.top_from(self.mixture(self._as_ids(context_ids)), k)

    def logprob_from(self, mix: Mixture, token_id: int) -> float:
        """``logprob`` for an already computed mixture."""
        return math.log(self._prob(mix, int(token_id)))

    def top_from(self, mix: Mixture, k: int) -> list[tuple[int, float]]:
        """``top_logprobs`` for an already computed mixture; ``k = -1`` lists every token held."""
        if k < 0:
            dense, extra_ids, extra_p = self._dense(mix)
            ids = np.concatenate([self.vocab_ids, extra_ids])
            probs = np.concatenate([dense, extra_p])
            order = np.lexsort((ids, -probs))
            ids, probs = ids[order], probs[order]
        else:
            ids, probs = self._top(mix, k)
        return [(i, math.log(p)) for i, p in zip(ids.tolist(), probs.tolist())]

    def greedy(self, context_ids: Sequence[int]) -> int:
        """The most likely next token (the lowest id among ties)."""
        ids, _ = self._top(self.mixture(self._as_ids(context_ids)), 1)
        return int(ids[0])

    def score(
        self,
        token_ids: Sequence[int],
        *,
        k: int,
        start: int = 1,
        with_rank: bool = False,
    ) -> list[ScoredPosition]:
        """Score ``token_ids[start:]``, each after the tokens before it: logprob, top ``k``, optionally rank.

        ``k = -1`` lists every token held at each position. Rank is 1 + the number of tokens strictly
        more likely. Positions already scored after the same prefix are served from a fixed-size table
        (``ScoreTable``, allocated whole), so re-scoring a growing prompt (echo verification, round after
        round) costs only its new positions and the memory does not grow with the run.
        """
        ids = self._as_ids(token_ids)
        tokens = ids.tolist()
        keys = []
        prefix_key = 0  # chained hash of tokens[:pos]
        for pos, token in enumerate(tokens):
            if pos >= start:
                keys.append((hash((prefix_key, pos, token, k, with_rank)) & _MASK64) or 1)  # 0 marks an empty row
            prefix_key = hash((prefix_key, token))
        first = max(start, 0)
        table = self._score_table(k)
        if table is None:
            return [self._score_position(ids[:pos], tokens[pos], k, with_rank) for pos in range(first, len(tokens))]
        recent = self._recent_scores
        with self._score_lock:
            out: list[ScoredPosition | None] = [recent.get(key) for key in keys]
            for key, found in zip(keys, out):
                if found is not None:
                    recent.move_to_end(key)
            missing = [offset for offset, found in enumerate(out) if found is None]
            held = table.get_many([keys[offset] for offset in missing])
        for offset, found in zip(missing, held):
            pos = first + offset
            computed = found is None
            if computed:
                scored = self._score_position(ids[:pos], tokens[pos], k, with_rank)
            else:
                scored = ScoredPosition(tokens[pos], *found)
            out[offset] = scored
            with self._score_lock:
                if computed:
                    table.put(keys[offset], scored.logprob, scored.rank, scored.top)
                recent[keys[offset]] = scored
                if len(recent) > _RECENT_SCORES_SIZE:
                    recent.popitem(last=False)
        return out  # type: ignore[return-value]  # every position is filled above

    def _score_table(self, k: int) -> ScoreTable | None:
        """The table for top lists of ``k`` alternatives (``None`` past the widest: not kept).

        All widths are made together at the model's first scoring, so that their memory is taken at the
        start of a run rather than whenever a request first asks for a wider list."""
        width = next((w for w in _SCORE_TABLE_SLOTS if k <= w), None)
        if k < 0 or width is None:
            return None
        with self._score_lock:
            if not self._score_tables:
                self._score_tables = {w: ScoreTable(slots=n, width=w) for w, n in _SCORE_TABLE_SLOTS.items()}
            return self._score_tables[width]

    def _score_position(self, context: np.ndarray, token: int, k: int, with_rank: bool) -> ScoredPosition:
        mix = self.mixture(context)
        p_actual = self._prob(mix, int(token))
        rank = None
        if with_rank:
            dense, _, extra_p = self._dense(mix)
            rank = int(np.count_nonzero(dense > p_actual) + np.count_nonzero(extra_p > p_actual)) + 1
        return ScoredPosition(token_id=token, logprob=math.log(p_actual), rank=rank, top=tuple(self.top_from(mix, k)))

    def sample(
        self,
        context_ids: Sequence[int],
        *,
        temperature: float,
        top_p: float = 1.0,
        rng: np.random.Generator,
    ) -> int:
        """Draw the next token at ``temperature`` (0 = greedy) within nucleus ``top_p``."""
        return self.sample_from(self.mixture(self._as_ids(context_ids)), temperature, top_p, rng)

    def sample_from(self, mix: Mixture, temperature: float, top_p: float, rng: np.random.Generator) -> int:
        """``sample`` for an already computed mixture."""
        if temperature <= 0.0:
            ids, _ = self._top(mix, 1)
            return int(ids[0])
        dense, extra_ids, extra_p = self._dense(mix)
        ids = np.concatenate([self.vocab_ids, extra_ids])
        probs = np.concatenate([dense, extra_p])
        weights, tail_weight = _tempered(probs, self.tail_prob, temperature)
        tail_count = UNIVERSE_SIZE - len(ids)
        total = float(weights.sum()) + tail_weight * tail_count
        if top_p < 1.0:
            order = np.lexsort((ids, -weights))
            cumulative = np.cumsum(weights[order]) / total
            cut = int(np.searchsorted(cumulative, top_p)) + 1
            if cut <= len(order):  # the nucleus closes before the uniform tail: leave the tail out
                ids, weights = ids[order[:cut]], weights[order[:cut]]
                total = float(weights.sum())
                tail_count = 0
        cumulative = np.cumsum(weights)
        index = int(np.searchsorted(cumulative, rng.random() * total, "right"))
        if index < len(ids) or tail_count == 0:
            return int(ids[min(index, len(ids) - 1)])
        tail = self._tail_ids()
        tail = tail[~np.isin(tail, extra_ids)]
        return int(tail[int(rng.integers(len(tail)))])

    def _tail_ids(self) -> np.ndarray:
        if self._complement is None:
            universe = np.append(np.arange(EOS_TOKEN_ID - 1), EOS_TOKEN_ID)
            self._complement = np.setdiff1d(universe, self.vocab_ids, assume_unique=True)
        return self._complement


_MASK64 = (1 << 64) - 1
_MAX_COPY_MATCH = 64
_FEW_ENDS = 24  # up to this many earlier occurrences, _copy_terms_few is the faster
_MIN_LOOP_PERIOD = 2
_UNIGRAM_HEAD = 64
_DOMAIN_TEMPERATURE = 4.0
# Rows of the score tables by top-list width (k = 0 or 1, up to 5, up to 20): about 2.8, 2.9 and 4.4 MB,
# allocated when a model is first scored.
_SCORE_TABLE_SLOTS = {1: 65_536, 5: 32_768, 20: 16_384}
# The most recently used scored positions are also kept as objects (about 530 bytes each), so that the
# common re-score costs a dict lookup; the table behind them builds objects anew (several times slower).
_RECENT_SCORES_SIZE = 2_048
_MIXTURE_CACHE_SIZE = 1_024
_LEVELS_SEEN_SIZE = 1_024
_NO_IDS = np.zeros(0, dtype=np.int64)
# The chat template's role markers (template.py) in cl100k_base: ``<``, ``|``, the role, ``|``, ``>\n``.
_BAR_ID = 91
_ROLE_IDS = np.array([9125, 35501, 882, 78191, 14506])  # system, developer, user, assistant, tool
_NO_PROBS = np.zeros(0)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_TOP53 = np.uint64(11)
_LOGISTIC_TO_UNIT = math.sqrt(3.0) / math.pi


def _unique_with_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for the small arrays of a mixture, in a third of its time."""
    ordered = np.sort(values)
    keep = np.empty(ordered.size, dtype=bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    ids = ordered[keep]
    return ids, ids.searchsorted(values)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = (x ^ (x >> _SHIFTS[0])) * _MIX1
    x = (x ^ (x >> _SHIFTS[1])) * _MIX2
    return x ^ (x >> _SHIFTS[2])


def _hashed_noise(key: int, ids: np.ndarray) -> np.ndarray:
    """A number per id, fixed by ``key``, from a logistic distribution scaled to unit variance (close enough
    to a standard normal for an idiosyncrasy, and cheap)."""
    bits = _mix64(ids.astype(np.uint64) * _GOLDEN + np.uint64(key))
    u = ((bits >> _TOP53).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
    return _LOGISTIC_TO_UNIT * np.log(u / (1.0 - u))


def _tempered(probs: np.ndarray, tail_prob: float, temperature: float) -> tuple[np.ndarray, float]:
    """Unnormalised weights ``p ** (1 / T)`` (divided by the largest, for range), and one tail token's weight."""
    if temperature == 1.0:
        return probs, tail_prob
    logs = np.log(probs)
    top = float(logs.max())
    return np.exp((logs - top) / temperature), math.exp((math.log(tail_prob) - top) / temperature)


@functools.lru_cache(maxsize=1)
def _shared_vocab() -> np.ndarray:
    return np.unique(load_corpus().stream())


@functools.lru_cache(maxsize=None)
def _build(spec: ModelSpec) -> NGramModel:
    corpus = load_corpus()
    kinds = dict.fromkeys(kind for kind, _, _ in spec.documents)
    streams = {kind: corpus.stream([d for d in spec.documents if d[0] == kind]) for kind in kinds}
    return NGramModel(spec, streams, _shared_vocab())


def get_model(model: str | ModelSpec) -> NGramModel:
    """A built model by registry name or spec (built once per process, then cached)."""
    if isinstance(model, str):
        try:
            model = MODEL_SPECS[model]
        except KeyError:
            raise KeyError(f"unknown simulated model {model!r}; known: {', '.join(MODEL_SPECS)}") from None
    return _build(model)
