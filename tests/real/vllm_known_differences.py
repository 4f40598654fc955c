"""Real-vLLM tests that fail today on the trained models (tests/real/make_vllm_models.py), each with
what differs. conftest.py marks them xfail (not strict), so each run lists them as xfailed, or as
xpassed once fixed: then take the line out. Every entry is an open defect of specapi on real vLLM."""

KNOWN_DIFFERENCES: dict[str, str] = {}
