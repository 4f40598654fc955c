"""What one endpoint offers, as the capability probe (`specapi.parts.probe`) found it.

The fields are named as the wire names what they stand for (`prompt_logprobs`: vLLM scores a chat
request's prompt tokens), since `specapi probe --json` reports them under these names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Capabilities"]


@dataclass(frozen=True)
class Capabilities:
    """What one endpoint supports. `notes` explains each finding in words."""

    completions: bool = False
    completions_logprobs: int = 0  # largest top-k the completions endpoint returned (0 = none)
    max_logprobs: int | None = None  # the largest `logprobs` the echo request was accepted with
    echo_logprobs: bool = False
    prompt_logprobs: bool = False  # vLLM's prompt_logprobs on chat (with prompt_token_ids)
    chat: bool = False
    chat_logprobs: int = 0
    chat_prefill: bool = False  # continues a final assistant message
    prefill_style: str | None = None  # CONTINUE_FINAL_MESSAGE or TRAILING (dialects/openai.py)
    prefill_echoes_prefix: bool = False  # llama-server returns the prefix inside content
    predicted_outputs: bool = False
    logprobs_raw: bool | None = None  # True: logprobs ignore temperature; None: unknown
    offsets_from_prompt_start: bool | None = None  # text_offset's convention (reported, never relied on)
    server: str | None = None  # "llama-server", "llama-cpp-python", "vllm" or "sglang" when recognised
    #: The server takes token-id prompts (its native dialect tokenized a probe text): token-id verification.
    token_ids: bool = False
    #: Sampling settings the server applies to requests that do not set them (None: OpenAI's, 1.0 and 1.0).
    sampler_defaults: dict[str, float] | None = None
    #: The caller's last tokens the target must write in one call for the text to end as its own would.
    #: Servers that cut a character at the limit render it alike however the call began (0);
    #: llama-cpp-python finishes it past the limit, but only once its call has generated three bytes,
    #: and one of its one-token steps can run many tokens on.
    final_stretch: int = 0
    #: The limit the server gives a completions request that sets none (None: to the context's end).
    default_max_tokens: int | None = 16
    #: The server's context window in tokens (llama-server's slot `n_ctx`, vLLM's `max_model_len`), if known.
    context_window: int | None = None
    #: A completions stream ends with the usage though the request did not ask for it (`stream_options`):
    #: llama-server puts it on the chunk with the finish_reason (its chat streams do not).
    stream_usage_unasked: bool = False
    #: The server counts the prompt's tokens in `repeat_penalty`, `presence_penalty` and `frequency_penalty`
    #: (over its last `repeat_last_n` tokens, prompt and output alike): llama-server feeds the prompt into its
    #: penalty sampler, so a call on prompt + draft is penalised as the target alone is at that position.
    penalties_over_prompt: bool = False
    #: The server's chat content leaves out the bytes of an unfinished token run without a mark (no
    #: U+FFFD), and its logprobs list the run only once it ends (llama-server): a chat step the text
    #: continues from is cut back to the runs listed (`target_alone._whole_runs`).
    chat_hides_partial_runs: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def refuses_greedy_choices(self) -> bool:
        """The server refuses `n` above 1 with greedy sampling (vLLM: "n must be 1 when using greedy
        sampling"): such a request is the target's to answer."""
        return self.server == "vllm"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def scores_chat_prompts(self) -> bool:
        """A chat request can have the target score its prompt (vLLM), so chat verifies like echo."""
        return self.prompt_logprobs
