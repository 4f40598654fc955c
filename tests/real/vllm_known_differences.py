"""Real-vLLM tests that fail today on the trained models (tests/real/make_vllm_models.py), each with
what differs. conftest.py marks them xfail (not strict), so each run lists them as xfailed, or as
xpassed once fixed: then take the line out. Every entry is an open defect of specapi on real vLLM."""

KNOWN_DIFFERENCES: dict[str, str] = {
    'test_real_vllm_conformance.py::test_completions_on_every_path_equal_vllm_alone[auto-stream]': "with the caller's logprobs, auto verifies by echo on vLLM, and a streamed answer loses some of the target's logprobs: written again alone after re-tokenization, the entries after what the stream already handed out are dropped where that text ends inside a token's bytes; finished by the target alone, the first entries are repeated where tokens hold parts of characters (CJK)",
    'test_real_vllm_conformance.py::test_cjk_and_emoji_property_cases_equal_vllm_alone[completions]': "with the caller's logprobs, auto verifies by echo on vLLM, and a streamed answer loses some of the target's logprobs: written again alone after re-tokenization, the entries after what the stream already handed out are dropped where that text ends inside a token's bytes; finished by the target alone, the first entries are repeated where tokens hold parts of characters (CJK)",
}
