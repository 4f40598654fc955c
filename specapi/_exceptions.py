"""The exceptions specapi raises.

Every error specapi raises derives from `SpecAPIError`:

    SpecAPIError
    ├── ConfigurationError       bad arguments; raised before any request is sent (also a ValueError)
    ├── UnsupportedRequestError  a request that cannot be served at all (also a ValueError)
    └── EndpointError            an endpoint failed; carries `role` ("draft" or "target") and `endpoint`
        ├── DraftError           the draft endpoint failed (normally absorbed: generation degrades to the target)
        ├── TargetError          the target endpoint failed; never returned as partial text
        └── MalformedResponseError  an endpoint answered with a payload specapi cannot trust

Endpoint errors are raised `from` the SDK's exception, so `err.__cause__` is the original
`openai.APIError` (with its request and response).
"""

from __future__ import annotations

__all__ = [
    "SpecAPIError",
    "ConfigurationError",
    "UnsupportedRequestError",
    "EndpointError",
    "DraftError",
    "TargetError",
    "MalformedResponseError",
]


class SpecAPIError(Exception):
    """Base class of every error specapi raises."""


class ConfigurationError(SpecAPIError, ValueError):
    """Invalid arguments or options, detected before any request is sent."""


class UnsupportedRequestError(SpecAPIError, ValueError):
    """A request that neither speculation nor the target alone can serve."""


class EndpointError(SpecAPIError):
    """A call to an endpoint failed. `role` is "draft" or "target"; `endpoint` names the URL and model."""

    def __init__(self, message: str, *, role: str, endpoint: str, status_code: int | None = None) -> None:
        super().__init__(f"{role} endpoint {endpoint}: {message}")
        self.role = role
        self.endpoint = endpoint
        self.status_code = status_code


class DraftError(EndpointError):
    """The draft endpoint failed."""


class TargetError(EndpointError):
    """The target endpoint failed."""


class MalformedResponseError(EndpointError):
    """An endpoint's response lacks or contradicts the fields that verification needs."""
