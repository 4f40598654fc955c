"""What a simulated server accepts and how it shapes its answers, as plain flags.

The built-in profiles (``CAPABILITY_PROFILES``) follow the real servers described in
``/work/shared/reference/providers.md``:

* ``"vllm"``: completions with ``echo`` + ``logprobs`` (prompt logprobs, position 0 null, up to 20, ``-1`` =
  all), offsets from 0 at the start of the returned text, the ``prompt_logprobs`` extra (not with
  streaming), chat ``continue_final_message``; requests with prompt logprobs skip the prefix cache.
* ``"openai"``: completions refuse ``echo`` together with ``logprobs`` (``invalid_parameter_combination``),
  logprobs up to 5, offsets counted from the prompt's start; chat logprobs up to 20; Predicted Outputs;
  fields outside the OpenAI API are refused.
* ``"llamacpp"``: completions refuse ``echo`` and answer logprobs in the chat shape; chat logprobs with
  ``top_logprobs`` 20 by default; a trailing assistant message is continued and returned with its prefix.
* ``"sglang"``: completions with ``echo`` + ``logprobs`` (prompt logprobs, which bypass the radix cache),
  every ``text_offset`` -1, ``max_tokens`` at least 1, prompt lists; chat ``continue_final_message``.

``dialect`` names the server family whose native API the simulator serves besides the OpenAI endpoints
(``native.py``): vLLM's ``/tokenize``, ``/detokenize``, ``/version`` and its token-id extras on
completions; SGLang's ``/generate`` and ``/get_model_info``; llama-server's ``/completion``, ``/tokenize``,
``/detokenize``, ``/props`` and ``/health``. ``"openai"`` serves none of them.

Build a custom one with ``dataclasses.replace(CAPABILITY_PROFILES["vllm"], name=..., ...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CAPABILITY_PROFILES", "Capabilities", "get_capabilities"]


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """Flags of one server flavour.

    Completions: ``completions_echo`` (echo accepted at all), ``echo_error`` (message of the 400 when it is
    not), ``echo_with_logprobs`` (echo and logprobs together; else 400 ``invalid_parameter_combination``),
    ``completions_max_logprobs`` (largest integer ``logprobs``), ``logprobs_all`` (``-1`` = every token),
    ``offsets_from_prompt_start`` (``text_offset`` counts the prompt even without echo, as OpenAI does; else
    0 is the start of the returned text, as vLLM does), ``completions_logprobs_chat_shape`` (logprobs come as
    ``{content: [...]}``, as llama.cpp does), ``prompt_logprobs_param`` (vLLM's ``prompt_logprobs``, also on
    chat), ``prompt_logprobs_skip_cache`` (requests with prompt logprobs re-prefill the whole prompt).

    Chat: ``chat_logprobs``, ``chat_max_top_logprobs``, ``chat_default_top_logprobs`` (when ``logprobs`` is
    on and ``top_logprobs`` absent), ``continue_final_message`` (vLLM's flag), ``assistant_prefill`` (a
    trailing assistant message is continued and the reply includes it, as llama-server does),
    ``predicted_outputs`` (OpenAI's ``prediction``).

    ``dialect``: the native API served (``"vllm"``, ``"sglang"``, ``"llamacpp"``, ``"openai"`` = none).
    ``batch_prompts``: completions take a list of prompts (each a string or token ids) and answer one
    choice per prompt (and per ``n``), in prompt order. ``offsets_unknown``: every ``text_offset`` is -1
    (SGLang). ``completions_zero_max_tokens``: ``max_tokens`` 0 is accepted with ``echo`` (not by SGLang).
    ``token_id_extras``: vLLM's ``return_token_ids`` and ``return_tokens_as_token_ids``.
    ``cut_at_context_end``: a ``max_tokens`` past the context window is cut at the window (finish "length"),
    and only a prompt that leaves no room is refused, as vLLM does; else the request is refused (OpenAI).
    ``lists_end_token``: a generation ended by the end-of-text token lists it in its logprobs (vLLM; it is
    billed everywhere, and never in the text).

    ``reject_unknown_params``: fields outside the OpenAI API (such as vLLM's extras) get a 400
    "Unrecognized request argument supplied", as OpenAI answers; other servers ignore what they do not know.
    """

    name: str
    completions_echo: bool = True
    echo_error: str = "Only no echo is supported"
    echo_with_logprobs: bool = True
    completions_max_logprobs: int = 20
    logprobs_all: bool = False
    offsets_from_prompt_start: bool = False
    completions_logprobs_chat_shape: bool = False
    prompt_logprobs_param: bool = False
    prompt_logprobs_skip_cache: bool = False
    chat_logprobs: bool = True
    chat_max_top_logprobs: int = 20
    chat_default_top_logprobs: int = 0
    continue_final_message: bool = False
    assistant_prefill: bool = False
    predicted_outputs: bool = False
    reject_unknown_params: bool = False
    dialect: str = "openai"
    batch_prompts: bool = False
    offsets_unknown: bool = False
    #: ``text_offset`` counts the lengths of the tokens as rendered before each (vLLM), not the text's
    #: characters: they differ where a token holding part of a character is rendered otherwise.
    offsets_rendered: bool = False
    completions_zero_max_tokens: bool = True
    token_id_extras: bool = False
    cut_at_context_end: bool = False
    lists_end_token: bool = False
    #: ``n`` above 1 with greedy sampling is refused with 400 (vLLM: "n must be 1 when using greedy sampling").
    greedy_single_choice: bool = False


CAPABILITY_PROFILES: Mapping[str, Capabilities] = {
    caps.name: caps
    for caps in (
        Capabilities(
            name="vllm",
            completions_max_logprobs=20,
            logprobs_all=True,
            prompt_logprobs_param=True,
            prompt_logprobs_skip_cache=True,
            continue_final_message=True,
            dialect="vllm",
            offsets_rendered=True,
            batch_prompts=True,
            token_id_extras=True,
            cut_at_context_end=True,
            lists_end_token=True,
            greedy_single_choice=True,
        ),
        Capabilities(
            name="openai",
            echo_with_logprobs=False,
            completions_max_logprobs=5,
            offsets_from_prompt_start=True,
            predicted_outputs=True,
            reject_unknown_params=True,
        ),
        Capabilities(
            name="llamacpp",
            completions_echo=False,
            completions_logprobs_chat_shape=True,
            chat_default_top_logprobs=20,
            assistant_prefill=True,
            dialect="llamacpp",
        ),
        Capabilities(
            name="sglang",
            completions_max_logprobs=20,
            prompt_logprobs_skip_cache=True,
            continue_final_message=True,
            dialect="sglang",
            batch_prompts=True,
            offsets_unknown=True,
            completions_zero_max_tokens=False,
        ),
    )
}


def get_capabilities(profile: str | Capabilities) -> Capabilities:
    """A profile by name (or the profile itself)."""
    if isinstance(profile, Capabilities):
        return profile
    try:
        return CAPABILITY_PROFILES[profile]
    except KeyError:
        raise KeyError(
            f"unknown capability profile {profile!r}; known: {', '.join(CAPABILITY_PROFILES)}"
        ) from None
