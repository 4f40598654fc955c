"""specapi: speculative decoding over OpenAI-format HTTP endpoints.

A cheap draft model proposes tokens, an expensive target model verifies them in one call, and the
output is the target's own: token for token when greedy, in distribution when sampling.
"""

from ._exceptions import (
    ConfigurationError,
    DraftError,
    EndpointError,
    InvalidRequestError,
    MalformedResponseError,
    SpecAPIError,
    TargetError,
    UnsupportedRequestError,
)
from .checks import EndpointStatus
from .client import AsyncSpeculativeOpenAI
from .endpoint import Endpoint
from .stats import RoleUsage, RoundRecord, SpeculativeStats
from .suffix import SuffixIndex
from .sync import SpeculativeOpenAI
from .types import SpeculativeChatCompletion, SpeculativeCompletion

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
