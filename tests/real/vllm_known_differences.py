"""Real-vLLM tests that fail today on the trained models (tests/real/make_vllm_models.py), each with
what differs. conftest.py marks them xfail (not strict), so each run lists them as xfailed, or as
xpassed once fixed: then take the line out. Every entry is an open defect of specapi on real vLLM."""

_SAMPLED_TEXT_PATH = (
    "sampled completions on a forced text path do not follow vLLM's distribution: on "
    "'def read_lines(path):\\n' specapi writes '\\n\\n' in about 3 of 4 samples, vLLM alone never "
    "(it writes '\\n' and then 'class', 'def', '#', ...); each such answer says exact=False, 'the target "
    "re-tokenized the text so far' (the text context is read back with other token boundaries)"
)
_SAMPLING = "test_real_vllm_sampling.py::test_sampled_two_tokens_follow_vllms_distribution_on_every_path"

_PARTIAL_CHARACTER_REDRAWN = (
    "sampled chat at T=1.0 answers too rarely with a token that ends inside a character: such a token is "
    "drawn again (its bytes are unknown on a token-id prompt), which is exact greedy but biases a sampled "
    "answer; over 400 two-token answers vLLM alone gave 8 empty ('' with finish 'length') and 7 starting "
    "with U+FFFD, specapi 1 and 0 (the chi-square passes or fails with the draw); each answer whose token "
    "was drawn again says exact=False ('a drawn token's bytes could not be read back'), 18 of 300 here"
)

KNOWN_DIFFERENCES: dict[str, str] = {
    f"{_SAMPLING}[True-auto-1.0]": _PARTIAL_CHARACTER_REDRAWN,
    f"{_SAMPLING}[True-prefill-fanout-1.0]": (
        "sampled chat at T=1.0 on forced prefill-fanout failed its chi-square in one of three runs here "
        "(p < 0.001); the same bias against tokens that end inside a character is suspected, not shown"
    ),
    f"{_SAMPLING}[False-echo-0.7]": _SAMPLED_TEXT_PATH,
    f"{_SAMPLING}[False-echo-1.0]": _SAMPLED_TEXT_PATH,
    f"{_SAMPLING}[False-prefill-fanout-0.7]": _SAMPLED_TEXT_PATH,
    f"{_SAMPLING}[False-prefill-fanout-1.0]": _SAMPLED_TEXT_PATH,
    f"{_SAMPLING}[True-prompt-logprobs-0.7]": (
        "sampled chat on forced prompt-logprobs keeps no draft token (0 of 300) though the draft's first "
        "token is the target's own 88% of the time; its samples do follow vLLM's distribution"
    ),
    f"{_SAMPLING}[True-prompt-logprobs-1.0]": (
        "sampled chat on forced prompt-logprobs keeps no draft token; its samples follow vLLM's "
        "distribution, and the draft's are told apart only at p = 0.0012 (needs < 0.001)"
    ),
}
