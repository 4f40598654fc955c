"""The seam to the openai SDK's private parts: every private module specapi imports from, and every
private function or attribute it calls, is here, with why.

specapi's clients are `openai.OpenAI` / `openai.AsyncOpenAI` subclasses whose `create` takes the SDK's
own parameters and returns the SDK's own objects, so a few parts the SDK does not export are needed. A
new SDK release that moves one of them breaks this module alone; `.ci/run` runs the drop-in tests
against the newest release the index has, and `pyproject.toml` bounds the major version.
Public names (`openai.NotGiven`, `openai.Omit`, `openai.not_given`, `openai.omit`, `openai.types.*`)
are imported from `openai` directly wherever they are used.
"""

from __future__ import annotations

from typing import Any

import openai

# The annotation types of the SDK's `create` signatures, which specapi's `create` repeats parameter for
# parameter (specapi/dialects/openai_params.py) so that type checkers and LangChain see the same
# parameters: the SDK does not export them.
from openai._types import Body, Headers, Query, SequenceNotStr

# The SDK's raw-response class: `with_raw_response.create` returns one (`.parse()`, `.headers`), and
# libraries check for it (specapi/surface/raw.py subclasses it).
from openai._legacy_response import LegacyAPIResponse

# Builds an SDK response object from a dict without validation, the way the SDK builds its own from the
# wire (extra fields kept): `openai.types.Completion.construct` would drop nested models' types.
from openai._models import construct_type

# Structured output (`parse`, `stream` with `response_format`): the SDK's own conversion of a pydantic
# type to a JSON schema, its check of strict tools and its parse of the answer, so parsed results and
# errors are the SDK's own.
from openai.lib._parsing import (
    ResponseFormatT,
    parse_chat_completion,
    type_to_response_format_param,
    validate_input_tools,
)

__all__ = [
    "Body",
    "Headers",
    "Query",
    "SequenceNotStr",
    "LegacyAPIResponse",
    "construct_type",
    "ResponseFormatT",
    "parse_chat_completion",
    "type_to_response_format_param",
    "validate_input_tools",
    "http_client_of",
    "sdk_beta",
    "status_error",
]


def http_client_of(sdk: openai.AsyncOpenAI) -> Any:
    """The SDK client's HTTP client (private `_client`): a specapi client's SDK half reuses the target's
    connection pool instead of opening a second one."""
    return sdk._client


def sdk_beta(cls: type[openai.OpenAI] | type[openai.AsyncOpenAI], client: Any) -> Any:
    """The SDK's own `client.beta` for `client` (the cached property's function: specapi overrides the
    property with its speculating `beta.chat.completions` and hands the other beta resources to this)."""
    return cls.beta.func(client)  # type: ignore[attr-defined]


def status_error(sdk: openai.AsyncOpenAI, response: Any) -> openai.APIStatusError:
    """The SDK's exception for an HTTP error response (private `_make_status_error_from_response`): the
    same class per status (`RateLimitError`, ...) and message the SDK raises, for replies read by
    specapi's own transport (specapi/transport/_http.py)."""
    return sdk._make_status_error_from_response(response)
