"""specapi: speculative decoding over OpenAI-format HTTP endpoints.

A cheap draft model proposes tokens, an expensive target model verifies them in one call, and the
output is the target's own: token for token when greedy, in distribution when sampling.
"""

from .transport._exceptions import (
    ConfigurationError,
    DraftError,
    EndpointError,
    InvalidRequestError,
    MalformedResponseError,
    SpecAPIError,
    TargetError,
    UnsupportedRequestError,
)
from .surface.checks import EndpointStatus
from .surface.client import AsyncSpeculativeOpenAI
from .transport.endpoint import Endpoint
from .core.stats import RoleUsage, RoundRecord, SpeculativeStats
from .parts.suffix import SuffixIndex
from .surface.sync import SpeculativeOpenAI
from .core.types import SpeculativeChatCompletion, SpeculativeCompletion

__version__ = "0.1.0"

__all__ = [
    "AsyncSpeculativeOpenAI",
    "SpeculativeOpenAI",
    "Endpoint",
    "SuffixIndex",
    "EndpointStatus",
    "SpeculativeStats",
    "RoleUsage",
    "RoundRecord",
    "SpeculativeCompletion",
    "SpeculativeChatCompletion",
    "SpecAPIError",
    "ConfigurationError",
    "InvalidRequestError",
    "UnsupportedRequestError",
    "EndpointError",
    "DraftError",
    "TargetError",
    "MalformedResponseError",
]
