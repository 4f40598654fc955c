"""LangChain's standard test suites (`langchain-tests`) for `ChatOpenAI`, pointed at the OpenAI-format
server named by `SPECAPI_LC_BASE_URL`: `specapi simulate`, or `specapi serve` in front of it.

Not collected by itself (no `test_` prefix): `test_langchain_standard.py` runs it in pytests of its own,
once against the simulator and once through the proxy, and compares the outcomes.

What the simulator cannot do is declared as the suites ask (`has_tool_calling`, `has_structured_output`),
so those tests skip, by name, in both runs: it refuses `tools` (400) and writes free text whatever the
`response_format`.
"""

from __future__ import annotations

import os

from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

BASE_URL = os.environ.get("SPECAPI_LC_BASE_URL", "http://127.0.0.1:9/v1")


class _OnTheSimulator:
    @property
    def chat_model_class(self) -> type[ChatOpenAI]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict:
        # stream_usage: ask for usage in streams (ChatOpenAI asks by itself only on OpenAI's own URL).
        return {"model": "sim-target", "base_url": BASE_URL, "api_key": "unused", "stream_usage": True}

    @property
    def model_override_value(self) -> str:
        return "sim-target-clone"  # another model of the same server

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False


class TestChatOpenAIUnit(_OnTheSimulator, ChatModelUnitTests):
    pass


class TestChatOpenAIIntegration(_OnTheSimulator, ChatModelIntegrationTests):
    pass
