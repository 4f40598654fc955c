"""Bench scenarios: which endpoints, which client options, which requests. Immutable data.

A `Scenario` names a simulated pair (``SimSetup``: server flavour, latency profile, seed) or real
endpoints (set by the command), the speculative client's options, and the requests to send. The
built-in scenarios (``SCENARIOS``; ``DEFAULT_SCENARIOS`` run when none is named) cover where speculation
wins and where it loses:

* ``lan-code``: a vLLM-like pair on a LAN, greedy code completion, fixed draft length, sequential rounds;
* ``hosted-fixed``: an OpenAI-like hosted pair (gpt-4o-like prices), fixed draft length: it loses;
* ``hosted-adaptive``: the default client on the same pair after three warm-up requests: the adaptive
  policy should notice and let the target generate alone;
* ``lookup-edit``: no draft model, prompt lookup on an editing task (the answer repeats the prompt);
* ``lan-adaptive``: the LAN pair with the adaptive policy and pipelined drafting;
* ``lan-code-t0.7`` / ``lookup-edit-t0.7``: the same two sampled at temperature 0.7 (one seed per request);
* ``lan-code-t1.0``: lan-code sampled at temperature 1.0 without a seed, as most traffic comes (one
  request a round on a tree of drafts); the group ``temperatures`` runs it beside ``lan-code`` and
  ``lan-code-t0.7-noseed`` (not run by default), so that the three compare in one run;
* ``seed-blog-t0.7``: the blog's question at its own temperature 0.7 on the LAN pair, default client (the
  full ``seed-blog`` experiment below is not run by default: it takes a minute);
* ``agentic`` / ``agentic-hosted`` (not run by default): a coding agent's requests, which repeat structure
  across requests, on the LAN pair and on the hosted pair; the suffix index warms up over the stream;
* ``token-boundary`` (not run by default): an exactness check on prompts whose last token can merge
  with the answer's first, on every token-id dialect of the simulator (vLLM, SGLang, llama.cpp) and, for
  contrast, with echo verification, which sends text;
* ``long-context`` (not run by default): a prompt of about 4,000 tokens on the vLLM-like pair, echo
  verification against token ids side by side.
* ``seed-blog`` (not run by default): the blog experiment specapi started from (``bench/blog.py``): its
  question on the hosted pair at temperature 0.7, plus the blog's own algorithm, specapi with
  ``prediction=``, and the lossy acceptance sweep.

The code prompts are Python standard-library code, which is also what the simulated models were
trained on (``specapi.sim.corpus``): there the draft and the target agree often, as a small and a large
code model do on boilerplate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .blog import QUESTION

__all__ = [
    "BenchRequest",
    "DEFAULT_SCENARIOS",
    "SCENARIOS",
    "Scenario",
    "SimSetup",
    "get_scenario",
    "get_scenarios",
    "SCENARIO_GROUPS",
    "load_prompts",
    "quick",
    "with_requests",
]


@dataclass(frozen=True)
class BenchRequest:
    """One request: a completions ``prompt`` or chat ``messages`` (exactly one of them)."""

    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a bench request needs exactly one of prompt and messages")

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def short(self, width: int = 40) -> str:
        """A one-line preview for tables and plots."""
        text = self.label or (self.prompt if self.prompt is not None else str((self.messages or [{}])[-1].get("content", "")))
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class SimSetup:
    """A simulated pair: ``specapi.sim.simulated_endpoints(profile=..., latency=..., seed=...)``."""

    profile: str = "vllm"
    latency: str = "lan"
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A named comparison of speculation with the target alone.

    ``client`` holds keyword arguments for ``AsyncSpeculativeOpenAI`` (policy, drafter, pipeline,
    num_speculative_tokens, verification); ``use_draft`` False drops the draft endpoint (prompt lookup
    only). ``warmup`` requests go through the speculative client before measuring (not counted): they
    open connections and run the capability probe; ``warmup_max_tokens`` (None: ``max_tokens``) keeps
    them short, except where an adaptive policy must learn from whole requests. ``aim`` is the speedup
    the scenario is expected to reach (or stay below, with ``aim_below``), shown next to the result.
    ``learning_requests``: the first measured requests during which the client is still learning from
    traffic (the suffix index warms up); the report gives the speedup after them too (and ``aim``
    applies to it). ``request_rate``, ``fresh_prompts`` and ``via`` set the load and the path (see the
    fields). ``seed_blog``: also run the blog experiment and the lossy acceptance sweep
    (``bench/blog.py``), reported with the scenario.
    """

    name: str
    description: str
    requests: tuple[BenchRequest, ...]
    sim: SimSetup | None = SimSetup()
    client: Mapping[str, Any] = field(default_factory=dict)
    use_draft: bool = True
    max_tokens: int = 60
    temperature: float = 0.0
    seed: int | None = None
    warmup: int = 1
    warmup_max_tokens: int | None = 4
    concurrency: int = 1
    #: Requests per second, arriving as a Poisson process (seeded); None: `concurrency` at a time, in waves.
    request_rate: float | None = None
    #: Each measured speculative request starts with an empty suffix index: nothing learnt from an earlier
    #: request (a repeated prompt, a warm-up on the same prompt) drafts for it, as for a prompt never seen.
    fresh_prompts: bool = False
    #: "client" (`AsyncSpeculativeOpenAI` in the bench's process) or "serve" (`specapi serve`'s app on loopback).
    via: str = "client"
    aim: float | None = None
    aim_below: bool = False
    note: str = ""
    learning_requests: int = 0
    seed_blog: bool = False
    #: In a sweep of draft lengths (`bench/sweep.py`): the scenario swept and this variant's setting
    #: (a draft length, or None for the default policy).
    sweep: tuple[str, int | None] | None = None

    @property
    def uses_suffix_index(self) -> bool:
        """Whether the client drafts from what it learnt of earlier requests (drafter auto or suffix)."""
        return self.drafter in ("auto", "suffix")

    @property
    def draft_length(self) -> int:
        return int(self.client.get("num_speculative_tokens", 4))

    @property
    def policy(self) -> str:
        policy = self.client.get("policy", "adaptive")
        return policy if isinstance(policy, str) else getattr(policy, "name", type(policy).__name__)

    @property
    def drafter(self) -> str:
        drafter = self.client.get("drafter", "auto")
        return drafter if isinstance(drafter, str) else getattr(drafter, "name", type(drafter).__name__)

    @property
    def pipeline(self) -> bool:
        return bool(self.client.get("pipeline", True))

    def settings(self) -> dict[str, Any]:
        """What was run, for the JSON report."""
        settings: dict[str, Any] = {
            "policy": self.policy,
            "drafter": self.drafter if self.use_draft else f"{self.drafter} (no draft model)",
            "pipeline": self.pipeline,
            "num_speculative_tokens": self.draft_length,
            "verification": self.client.get("verification", "auto"),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "requests": len(self.requests),
            "warmup_requests": self.warmup,
            "warmup_max_tokens": self.warmup_max_tokens or self.max_tokens,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "fresh_prompts": self.fresh_prompts,
            "via": self.via,
        }
        if self.learning_requests:
            settings["learning_requests"] = self.learning_requests
        if self.sim is not None:
            settings["simulator"] = {"profile": self.sim.profile, "latency": self.sim.latency, "seed": self.sim.seed}
        return settings


# -- prompts ------------------------------------------------------------------------------------

_CODE_PROMPTS = (
    BenchRequest(
        prompt='    def __init__(self,\n                 width=70,\n                 initial_indent="",',
        label="textwrap.TextWrapper.__init__",
    ),
    BenchRequest(prompt='def fnmatch(name, pat):\n    """Test whether FILENAME matches PATTERN.', label="fnmatch.fnmatch"),
    BenchRequest(
        prompt=(
            "def glob(pathname, *, root_dir=None, dir_fd=None, recursive=False,\n        include_hidden=False):\n"
            '    """Return a list of paths matching a pathname pattern.'
        ),
        label="glob.glob",
    ),
    BenchRequest(prompt='def abstractmethod(funcobj):\n    """A decorator indicating abstract methods.', label="abc.abstractmethod"),
)

_INDENT_SOURCE = '''def indent(text, prefix, predicate=None):
    """Adds 'prefix' to the beginning of selected lines in 'text'.

    If 'predicate' is provided, 'prefix' will only be added to the lines
    where 'predicate(line)' is True. If 'predicate' is not provided,
    it will default to adding 'prefix' to all non-empty lines that do not
    consist solely of whitespace characters.
    """
    if predicate is None:
        def predicate(line):
            return line.strip()

    def prefixed_lines():
        for line in text.splitlines(True):
            yield (prefix + line if predicate(line) else line)
    return ''.join(prefixed_lines())
'''

_FNMATCH_SOURCE = '''def filter(names, pat):
    """Construct a list from those elements of the iterable NAMES that match PAT."""
    result = []
    pat = os.path.normcase(pat)
    match = _compile_pattern(pat)
    if os.path is posixpath:
        # normcase on posix is NOP. Optimize it away from the loop.
        for name in names:
            if match(name):
                result.append(name)
    else:
        for name in names:
            if match(os.path.normcase(name)):
                result.append(name)
    return result
'''

def _edit_prompt(source: str, label: str) -> BenchRequest:
    """Ask for a corrected copy of `source` (with a typo planted) and start the answer off.

    The prompt ends inside the first line, right after a comma, so the answer continues with a token
    that starts with a space (``" prefix"``) rather than one that could merge with the prompt's last token.
    """
    broken = source.replace("return", "retrun", 1)
    first_line = source.split("\n", 1)[0]
    start = first_line[: first_line.index(",") + 1]
    return BenchRequest(prompt=f"Fix the typo in this function:\n\n{broken}\nFixed:\n\n{start}", label=f"edit {label}")


_BOUNDARY_PROMPTS = (
    BenchRequest(
        prompt='def dedent(text):\n    """Remove any common leading whitespace from every line in `text`.\n',
        label="ends with a newline",
    ),
    BenchRequest(
        prompt=f"Fix the typo in this function:\n\n{_INDENT_SOURCE.replace('return', 'retrun', 1)}\nFixed:\n\n{_INDENT_SOURCE.split(chr(10))[0]}",
        label="edit, ends with a colon",
    ),
)

def _long_code_prompt(tokens: int = 4000) -> BenchRequest:
    """Standard-library modules, whole, until about `tokens` cl100k tokens, then the start of a function."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    text = ""
    for module in ("textwrap.py", "fnmatch.py", "glob.py", "shlex.py", "string.py", "bisect.py", "heapq.py", "calendar.py"):
        try:
            text += (root / module).read_text(encoding="utf-8") + "\n\n"
        except OSError:
            continue
        if len(text) >= tokens * 4:
            break
    text = text[: tokens * 4]
    text = text[: text.rfind("\n") + 1] + 'def dedent(text):\n    """Remove any common leading whitespace from every line in `text`.'
    return BenchRequest(prompt=text, label=f"{len(text) // 1000}k characters of stdlib code, then dedent()")


_LONG_PROMPTS = (_long_code_prompt(),)

_EDIT_PROMPTS = (
    _edit_prompt(_INDENT_SOURCE, "textwrap.indent"),
    _edit_prompt(_FNMATCH_SOURCE, "fnmatch.filter"),
)


_AGENT_PREAMBLE = """You are a coding agent working in a Python repository. Each step, answer with one tool call
as JSON; a write_file call carries the whole new file. Tools:
  {"tool": "read_file", "path": "..."}
  {"tool": "write_file", "path": "...", "content": "..."}
  {"tool": "run_tests", "path": "..."}
"""

#: (module, the start of the function the agent rewrites): what an agent's write_file calls look like.
_AGENT_TASKS = (
    ("fnmatch", 'def fnmatch(name, pat):\n    """Test whether FILENAME matches PATTERN.'),
    ("abc", 'def abstractmethod(funcobj):\n    """A decorator indicating abstract methods.'),
    ("textwrap", 'def dedent(text):\n    """Remove any common leading whitespace from every line in `text`.'),
    ("string", 'def capwords(s, sep=None):\n    """capwords(s [,sep]) -> string'),
)


def _agent_step(step: int) -> tuple[str, str, str]:
    """(instructions, observation, the call begun) of one agent step: the same tool-call JSON and code
    come back across steps, around observations that change every time."""
    module, start = _AGENT_TASKS[step % len(_AGENT_TASKS)]
    observation = f"Step {step + 1}. Observation: run_tests(tests/test_{module}.py) failed, {3 + step % 5} errors (run {1000 + 37 * step})."
    call = f'{{"tool": "write_file", "path": "lib/{module}.py", "content": """\n{start}'
    return _AGENT_PREAMBLE, observation, call


def _agentic_requests(count: int, *, chat: bool) -> tuple[BenchRequest, ...]:
    requests = []
    for step in range(count):
        instructions, observation, call = _agent_step(step)
        label = f"step {step + 1}: {_AGENT_TASKS[step % len(_AGENT_TASKS)][0]}"
        if chat:
            messages = (
                {"role": "system", "content": instructions},
                {"role": "user", "content": f"{observation}\nContinue this call exactly where it stops:\n{call}"},
            )
            requests.append(BenchRequest(messages=messages, label=label))
        else:
            requests.append(BenchRequest(prompt=f"{instructions}\n{observation}\nCall: {call}", label=label))
    return tuple(requests)


def load_prompts(path: str | Path) -> tuple[BenchRequest, ...]:
    """Requests from a JSON-lines file: each line ``{"prompt": "..."}`` or ``{"messages": [...]}``.

    Blank lines are skipped. Raises ValueError naming the line of anything else.
    """
    requests = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if isinstance(item, Mapping) and isinstance(item.get("prompt"), str):
            requests.append(BenchRequest(prompt=item["prompt"], label=str(item.get("label", ""))))
        elif isinstance(item, Mapping) and isinstance(item.get("messages"), list) and item["messages"]:
            messages = item["messages"]
            if not all(isinstance(m, Mapping) and "role" in m for m in messages):
                raise ValueError(f"{path}:{number}: each message needs a 'role'")
            requests.append(BenchRequest(messages=tuple(dict(m) for m in messages), label=str(item.get("label", ""))))
        else:
            raise ValueError(f'{path}:{number}: expected {{"prompt": "..."}} or {{"messages": [...]}}')
    if not requests:
        raise ValueError(f"{path}: no prompts")
    return tuple(requests)


# -- the scenarios ------------------------------------------------------------------------------


def _lan_code_unseeded(name: str, temperature: float, why: str) -> Scenario:
    """lan-code sampled without a seed, as most traffic comes: a round is one target request over a tree of drafts."""
    return Scenario(
        name=name,
        description=(
            f"lan-code sampled at temperature {temperature} without a seed ({why}): a round is one target request over "
            "a tree of drafts, eight chains the draft samples"
        ),
        requests=_CODE_PROMPTS,
        sim=SimSetup(profile="vllm", latency="lan"),
        client={"policy": "fixed", "num_speculative_tokens": 5, "drafter": "model", "pipeline": False},
        max_tokens=60,
        temperature=temperature,
    )


_BUILT_IN = (
    Scenario(
        name="lan-code",
        description=(
            "vLLM-like pair on a LAN (target 30 ms to first token + 25 ms/token, draft 4 ms + 4 ms/token), "
            "greedy code completion of 60 tokens, draft model, fixed 5 tokens per round, no pipelining"
        ),
        requests=_CODE_PROMPTS,
        sim=SimSetup(profile="vllm", latency="lan"),
        client={"policy": "fixed", "num_speculative_tokens": 5, "drafter": "model", "pipeline": False},
        max_tokens=60,
        aim=1.6,
    ),
    Scenario(
        name="hosted-fixed",
        description=(
            "OpenAI-like hosted pair (target 400 ms to first token + 12 ms/token at gpt-4o prices, draft 300 ms + "
            "8 ms/token at gpt-4o-mini prices), greedy code completion of 12 tokens, draft model, fixed 4 tokens per round"
        ),
        requests=_CODE_PROMPTS[1:3],
        sim=SimSetup(profile="openai", latency="hosted"),
        client={"policy": "fixed", "num_speculative_tokens": 4, "drafter": "model", "pipeline": False},
        max_tokens=12,
        aim=1.0,
        aim_below=True,
    ),
    Scenario(
        name="hosted-adaptive",
        description=(
            "the same hosted pair with the default client (adaptive policy, auto drafter, pipelining), "
            "measured after three warm-up requests"
        ),
        requests=_CODE_PROMPTS,
        sim=SimSetup(profile="openai", latency="hosted"),
        client={},
        max_tokens=12,
        warmup=3,
        warmup_max_tokens=None,
        aim=0.85,
    ),
    Scenario(
        name="lookup-edit",
        description=(
            "no draft model: prompt lookup on an editing task (fix a typo in a function: the answer repeats "
            "the prompt), LAN vLLM-like target, 80 tokens, 10 tokens per round"
        ),
        requests=_EDIT_PROMPTS,
        sim=SimSetup(profile="vllm", latency="lan"),
        client={"policy": "fixed", "num_speculative_tokens": 10, "drafter": "lookup"},
        use_draft=False,
        max_tokens=80,
        aim=2.0,
    ),
    Scenario(
        name="lan-adaptive",
        description=(
            "the LAN pair with the adaptive draft length and pipelined drafting (draft model), "
            "measured after three warm-up requests"
        ),
        sim=SimSetup(profile="vllm", latency="lan"),
        client={"policy": "adaptive", "drafter": "model", "pipeline": True},
        requests=_CODE_PROMPTS[:3],
        max_tokens=60,
        warmup=3,
        warmup_max_tokens=None,
        aim=2.0,
    ),
    Scenario(
        name="lan-code-t0.7",
        description=(
            "lan-code sampled at temperature 0.7 (one seed per request): auto verifies sampled requests in token "
            "ids, and the draft model proposes its most likely tokens"
        ),
        requests=_CODE_PROMPTS,
        sim=SimSetup(profile="vllm", latency="lan"),
        client={"policy": "fixed", "num_speculative_tokens": 5, "drafter": "model", "pipeline": False},
        max_tokens=60,
        temperature=0.7,
        seed=1,
    ),
    _lan_code_unseeded("lan-code-t1.0", 1.0, "the OpenAI API's default temperature"),
    _lan_code_unseeded("lan-code-t0.7-noseed", 0.7, "the blog's temperature"),
    Scenario(
        name="lookup-edit-t0.7",
        description=(
            "lookup-edit sampled at temperature 0.7, each edit with two seeds: a sampled answer leaves the prompt's "
            "text where a draw differs from it, and prompt lookup finds its place again"
        ),
        requests=_EDIT_PROMPTS * 2,
        sim=SimSetup(profile="vllm", latency="lan"),
        client={"policy": "fixed", "num_speculative_tokens": 10, "drafter": "lookup"},
        use_draft=False,
        max_tokens=80,
        temperature=0.7,
        seed=1,
    ),
    Scenario(
        name="agentic",
        description=(
            "a coding agent's stream of requests (tool-call JSON and the code it writes, repeating across steps "
            "around changing observations), default client with 16 tokens at most per round, LAN vLLM-like pair: "
            "the suffix index learns from each finished request"
        ),
        requests=_agentic_requests(16, chat=False),
        sim=SimSetup(profile="vllm", latency="lan"),
        client={"num_speculative_tokens": 16},
        max_tokens=96,
        warmup=0,
        learning_requests=4,
        aim=3.0,
        note="The first request of each task is drafted by the model and prompt lookup; later ones mostly by the suffix index.",
    ),
    Scenario(
        name="agentic-hosted",
        description=(
            "the same agent as chat requests on the OpenAI-like hosted pair (gpt-4o-like prices, Predicted Outputs): "
            "the suffix index's confident continuation goes as the prediction, no draft-model calls"
        ),
        requests=_agentic_requests(16, chat=True),
        sim=SimSetup(profile="openai", latency="hosted"),
        client={},
        max_tokens=96,
        warmup=0,
        learning_requests=4,
        aim=1.0,
    ),
    *(
        Scenario(
            name=f"token-boundary-{name}",
            description=(
                "an exactness check, not a speed one: prompts whose last token can merge with the answer's first "
                f"(a trailing newline, a trailing colon), default drafter, {label}, fixed 5 tokens per round"
            ),
            requests=_BOUNDARY_PROMPTS,
            sim=SimSetup(profile=profile, latency="lan"),
            client={"policy": "fixed", "num_speculative_tokens": 5, "verification": verification},
            max_tokens=40,
        )
        for name, profile, verification, label in (
            ("echo", "vllm", "echo", "LAN vLLM-like pair verified by echo (text: the target re-reads its output)"),
            ("vllm", "vllm", "token-ids", "LAN vLLM-like pair verified in token ids"),
            ("sglang", "sglang", "token-ids", "LAN SGLang-like pair verified in token ids (/generate)"),
            ("llamacpp", "llamacpp", "token-ids", "LAN llama.cpp-like pair verified in token ids (multi-prompt /completion)"),
        )
    ),
    *(
        Scenario(
            name=f"long-context-{verification}",
            description=(
                f"a code prompt of about 4,000 tokens on the LAN vLLM-like pair, verified by {verification}: "
                + (
                    "prompt logprobs re-prefill the whole context every round"
                    if verification == "echo"
                    else "one-token calls on the cached prefix, batched in one request"
                )
                + "; greedy, draft model, fixed 5 tokens per round"
            ),
            requests=_LONG_PROMPTS,
            sim=SimSetup(profile="vllm", latency="lan"),
            client={"policy": "fixed", "num_speculative_tokens": 5, "drafter": "model", "pipeline": False, "verification": verification},
            max_tokens=60,
        )
        for verification in ("echo", "token-ids")
    ),
    Scenario(
        name="seed-blog",
        description=(
            f"the blog experiment specapi started from: {QUESTION} on the OpenAI-like hosted pair (gpt-4o / gpt-4o-mini "
            "prices), temperature 0.7, 60 tokens, default client; with the blog's own algorithm, specapi with prediction= "
            "and the lossy acceptance sweep (on the LAN vLLM-like pair, where the target shows its probabilities)"
        ),
        requests=(BenchRequest(messages=({"role": "user", "content": QUESTION},), label="the blog's question"),),
        sim=SimSetup(profile="openai", latency="hosted"),
        client={},
        max_tokens=60,
        temperature=0.7,
        seed=1,
        seed_blog=True,
    ),
    Scenario(
        name="seed-blog-t0.7",
        description=(
            f"the blog's question ({QUESTION}) at its own temperature 0.7, on the LAN vLLM-like pair with the default "
            "client, without the blog experiment: chat, prose, sampled, two seeds"
        ),
        requests=(BenchRequest(messages=({"role": "user", "content": QUESTION},), label="the blog's question"),) * 2,
        sim=SimSetup(profile="vllm", latency="lan"),
        client={},
        max_tokens=60,
        temperature=0.7,
        seed=1,
        warmup=3,
        warmup_max_tokens=None,
    ),
)

SCENARIOS: Mapping[str, Scenario] = {s.name: s for s in _BUILT_IN}

#: Names that run several scenarios side by side.
SCENARIO_GROUPS: Mapping[str, tuple[str, ...]] = {
    "token-boundary": ("token-boundary-echo", "token-boundary-vllm", "token-boundary-sglang", "token-boundary-llamacpp"),
    "long-context": ("long-context-echo", "long-context-token-ids"),
    "temperatures": ("lan-code", "lan-code-t0.7-noseed", "lan-code-t1.0"),
}

DEFAULT_SCENARIOS: tuple[str, ...] = (
    "lan-code", "lan-code-t0.7", "lan-code-t1.0", "hosted-fixed", "hosted-adaptive", "lookup-edit", "lookup-edit-t0.7", "lan-adaptive", "seed-blog-t0.7",
)


def get_scenarios(name: str) -> list[Scenario]:
    """The scenario of that name, or the scenarios of that group."""
    return [get_scenario(n) for n in SCENARIO_GROUPS.get(name, (name,))]


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None


def quick(scenario: Scenario, *, requests: int = 2, max_tokens: int = 12) -> Scenario:
    """A fast variant for tests: no simulated latency, fewer and shorter requests, one warm-up."""
    sim = replace(scenario.sim, latency="instant") if scenario.sim is not None else None
    return replace(
        scenario,
        sim=sim,
        requests=tuple(scenario.requests[:requests]),
        max_tokens=min(scenario.max_tokens, max_tokens),
        warmup=min(scenario.warmup, 1),
        aim=None,
    )


def with_requests(requests: Sequence[BenchRequest], count: int | None) -> tuple[BenchRequest, ...]:
    """`count` requests cycling through `requests` (all of them once when count is None)."""
    if count is None:
        return tuple(requests)
    if count < 1:
        raise ValueError("need at least one request")
    return tuple(requests[i % len(requests)] for i in range(count))
