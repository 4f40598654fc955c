"""The exceptions specapi raises, and how they line up with the openai SDK's.

Every error specapi raises derives from `SpecAPIError`:

    SpecAPIError
    ├── ConfigurationError       bad arguments; raised before any request is sent (also a ValueError)
    │   └── InvalidRequestError  bad arguments to a `create` call; also an `openai.BadRequestError`
    ├── UnsupportedRequestError  a request that cannot be served at all (also a ValueError)
    └── EndpointError            an endpoint failed; carries `role` ("draft" or "target") and `endpoint`
        ├── DraftError           the draft endpoint failed (normally absorbed: generation degrades to the target)
        ├── TargetError          the target endpoint failed; never returned as partial text
        └── MalformedResponseError  an endpoint answered with a payload specapi cannot trust

Code written for the openai SDK keeps working: a failure that comes from the SDK (an HTTP status, a
timeout, a dropped connection) raises an instance of a class that derives from *both* specapi's class
for the role and the SDK's class for the failure, so `except openai.RateLimitError` and
`except specapi.TargetError` both catch a 429 from the target, plain or streamed:

    upstream failure                    SDK class (also raised)        specapi class, e.g. for the target
    HTTP 400                            openai.BadRequestError         TargetBadRequestError(TargetError, openai.BadRequestError)
    HTTP 401                            openai.AuthenticationError     TargetAuthenticationError
    HTTP 403                            openai.PermissionDeniedError   TargetPermissionDeniedError
    HTTP 404                            openai.NotFoundError           TargetNotFoundError
    HTTP 409                            openai.ConflictError           TargetConflictError
    HTTP 422                            openai.UnprocessableEntityError TargetUnprocessableEntityError
    HTTP 429                            openai.RateLimitError          TargetRateLimitError
    HTTP >= 500                         openai.InternalServerError     TargetInternalServerError
    other HTTP statuses                 openai.APIStatusError          TargetAPIStatusError
    timeout                             openai.APITimeoutError         TargetAPITimeoutError
    connection refused or dropped       openai.APIConnectionError      TargetAPIConnectionError
    a stream that breaks mid-way        the SDK's class for the break  Target<that class>

The draft's errors are built the same way on `DraftError` (`DraftRateLimitError`, ...); they reach you
only where a draft failure is not absorbed. The classes are made on first use and cached per pair
(`sdk_error_class(TargetError, openai.RateLimitError)` returns the same class every time). The
instance carries the SDK error's fields (`status_code`, `response`, `request`, `body`, `code`,
`request_id`, and `message`: the SDK's own, unchanged) and specapi's (`role`, `endpoint`); `str(err)`
names the role and endpoint, and `err.__cause__` is the SDK's original exception.

Bad arguments to `create` (negative `max_tokens`, `temperature` out of range, ...) raise
`InvalidRequestError`: a `ConfigurationError` (and `ValueError`) that is also an
`openai.BadRequestError` with status 400, raised before any request is sent (its `response` is a
synthetic 400 that never crossed the network; `param` names the argument when it can). Bad options to
the client itself (`Endpoint`, `policy`, ...) raise a plain `ConfigurationError`.

`MalformedResponseError` (a payload specapi cannot trust) is not an SDK error: the SDK would have
accepted the payload.
"""

from __future__ import annotations

import re
from typing import Any

import httpx2
import openai

__all__ = [
    "SpecAPIError",
    "ConfigurationError",
    "InvalidRequestError",
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


_LEADING_NAME = re.compile(r"^([a-z_][a-z0-9_]*)\b")


class InvalidRequestError(ConfigurationError, openai.BadRequestError):
    """Invalid arguments to a `create` call: a `ConfigurationError` that is also an `openai.BadRequestError`.

    Raised before any request is sent; `response` is a synthetic HTTP 400 (as an OpenAI server would
    answer) and `param` names the offending argument when the message starts with it.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        if param is None:
            match = _LEADING_NAME.match(message)
            param = match.group(1) if match else None
        body = {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_request"}
        request = httpx2.Request("POST", "http://specapi.invalid/v1")
        response = httpx2.Response(400, request=request, json={"error": body})
        openai.BadRequestError.__init__(self, message, response=response, body=body)


class UnsupportedRequestError(SpecAPIError, ValueError):
    """A request that neither speculation nor the target alone can serve."""


class EndpointError(SpecAPIError):
    """A call to an endpoint failed. `role` is "draft" or "target"; `endpoint` names the URL and model."""

    def __init__(self, message: str, *, role: str, endpoint: str, status_code: int | None = None) -> None:
        super().__init__(f"{role} endpoint {endpoint}: {message}")
        self.role = role
        self.endpoint = endpoint
        self.status_code = status_code

    @property
    def refused_shape(self) -> bool:
        """The endpoint refused what the request asked for (HTTP 400 or 422: a field or combination it
        does not take), which retrying or another request of the same shape will not change."""
        return getattr(self, "status_code", None) in (400, 422)

    @property
    def not_served(self) -> bool:
        """The endpoint does not serve the path or method asked for (HTTP 404 or 405)."""
        return getattr(self, "status_code", None) in (404, 405)


class DraftError(EndpointError):
    """The draft endpoint failed."""


class TargetError(EndpointError):
    """The target endpoint failed."""


class MalformedResponseError(EndpointError):
    """An endpoint's response lacks or contradicts the fields that verification needs."""


_SDK_CLASSES: dict[tuple[type[EndpointError], type[openai.APIError]], type[EndpointError]] = {}


def _init_from_sdk(self: Any, message: str, *, role: str, endpoint: str, cause: openai.APIError) -> None:
    """Fill both halves: the SDK error's fields copied from `cause`, then specapi's role and endpoint."""
    vars(self).update(vars(cause))
    Exception.__init__(self, f"{role} endpoint {endpoint}: {message}")  # the two halves' __init__s disagree
    self.role = role
    self.endpoint = endpoint
    self.status_code = getattr(cause, "status_code", None)
    # The SDK's own message, as the SDK alone would give it (`str(err)` adds the role and endpoint).
    self.message = cause.message if isinstance(getattr(cause, "message", None), str) else str(self)


def sdk_error_class(base: type[EndpointError], sdk_class: type[openai.APIError]) -> type[EndpointError]:
    """The class deriving from `base` (e.g. `TargetError`) and `sdk_class` (e.g. `openai.RateLimitError`).

    Made once per pair and cached, so `except` clauses and `type(err) is ...` checks see one class.
    """
    key = (base, sdk_class)
    cls = _SDK_CLASSES.get(key)
    if cls is None:
        prefix = base.__name__.removesuffix("Error")
        name = f"{prefix}{sdk_class.__name__}"
        doc = f"The {prefix.lower()} endpoint failed with `{sdk_class.__module__.split('.')[0]}.{sdk_class.__name__}`."
        cls = type(name, (base, sdk_class), {"__init__": _init_from_sdk, "__doc__": doc, "__module__": __name__})
        _SDK_CLASSES[key] = cls
    return cls


def endpoint_error(message: str, *, role: str, endpoint: str, status_code: int | None = None, cause: BaseException | None = None) -> EndpointError:
    """The error for a failed call by `role`: an SDK-flavoured subclass when `cause` is an SDK error."""
    base: type[EndpointError] = DraftError if role == "draft" else TargetError
    if isinstance(cause, openai.APIError):
        cls = sdk_error_class(base, type(cause))
        return cls(message, role=role, endpoint=endpoint, cause=cause)  # type: ignore[call-arg]
    return base(message, role=role, endpoint=endpoint, status_code=status_code)
