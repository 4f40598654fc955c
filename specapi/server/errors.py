"""OpenAI-shaped errors: every failure the proxy reports is `{"error": {message, type, param, code}}`.

`ProxyError` is what the handlers raise and render; `error_from_exception` maps specapi's exception tree
onto HTTP statuses:

    ConfigurationError, UnsupportedRequestError   400 invalid_request_error (param guessed from the message)
    EndpointError with upstream 400/413/422/429   the same status (the request itself was refused upstream);
                                                  for 400/413/422 the upstream's own error object, unchanged
    EndpointError timing out                      504 upstream_error
    any other EndpointError (5xx, 401, dropped)   502 upstream_error
    anything else                                 500 server_error (details only in the proxy's log)

Endpoint errors name the role ("draft"/"target") as an extra field `role`, and say what failed in words
of the role alone ("The target endpoint failed (HTTP 503)."): the upstream's address and its raw
message go to the proxy's log, not to its clients, whose callers need not know the deployment's hosts
and ports. Where the upstream's own error object is passed on (a refused request is the caller's error,
and reads as the target alone would have answered it) its message stays, with the upstreams' addresses
hidden. `expose=True` (`specapi serve --expose-upstream-errors`) sends the endpoint (an extra field
`endpoint`) and the upstream's message too. Every message passes through `redact`, so keys and URL
credentials never leave.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import openai

from ..transport._exceptions import ConfigurationError, EndpointError, MalformedResponseError, UnsupportedRequestError

__all__ = ["ProxyError", "error_from_exception", "redact", "hide_addresses", "guess_param", "PASSED_THROUGH_STATUSES"]

#: Upstream statuses that describe the client's request (not the proxy's setup): passed through as they are.
PASSED_THROUGH_STATUSES = frozenset({400, 413, 422, 429})

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_URL_QUERY = re.compile(r"(?P<url>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"]*)\?[^\s'\"]*")
_LEADING_NAME = re.compile(r"^\s*'?([a-z_][a-z0-9_]*)'?\b")
_QUOTED_NAME = re.compile(r"'([a-z_][a-z0-9_]*)'")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the given secrets, URL user-info (`user:pass@`) or URL query strings."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)
    return _URL_QUERY.sub(r"\g<url>?***", text)


def hide_addresses(text: str, addresses: Mapping[str, str]) -> str:
    """`text` without the upstreams' addresses: `addresses` maps each (an endpoint's label, base URL,
    host:port) to its role; "target endpoint <label>" becomes "target endpoint", any other mention "<target>"."""
    for address, role in sorted(addresses.items(), key=lambda item: len(item[0]), reverse=True):
        if address and address in text:
            text = text.replace(f"{role} endpoint {address}", f"{role} endpoint")
            # Whole words only: a host named "sim" is not hidden inside "simulator".
            text = re.sub(rf"(?<![\w.-]){re.escape(address)}(?![\w-])", f"<{role}>", text)
    return text


def guess_param(message: str, names: Iterable[str]) -> str | None:
    """The request parameter a validation message is about (its first word, or a quoted name), if known."""
    known = set(names)
    for pattern in (_LEADING_NAME, _QUOTED_NAME):
        for match in pattern.finditer(message):
            if match.group(1) in known:
                return match.group(1)
    if message.startswith("each message"):
        return "messages" if "messages" in known else None
    return None


class ProxyError(Exception):
    """A failure to report to the client as an OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code, **self.extra}}


def _retry_headers(exc: EndpointError) -> dict[str, str]:
    cause = exc.__cause__
    if not isinstance(cause, openai.APIStatusError):
        return {}
    return {name: cause.response.headers[name] for name in ("retry-after", "retry-after-ms") if name in cause.response.headers}


#: Upstream statuses that refuse the caller's request: the upstream's error object goes to the caller as it is.
_CALLERS_ERRORS = frozenset({400, 413, 422})


def _upstream_error(exc: EndpointError) -> dict[str, Any] | None:
    """The error object the upstream answered with (`{"message", "type", "param", "code", ...}`), if it
    sent one the SDK could read."""
    error = getattr(exc, "body", None)  # the SDK's `body`: the object under "error", as the upstream sent it
    if not isinstance(exc.__cause__, openai.APIStatusError) or not isinstance(error, dict):
        return None
    return error if isinstance(error.get("message"), str) and error["message"] else None


def _in_words(exc: EndpointError) -> str:
    """What failed, naming the role alone (no address, no upstream message)."""
    the = f"The {exc.role} endpoint"
    status = exc.status_code
    if isinstance(exc, MalformedResponseError):
        return f"{the} sent an answer the proxy cannot use."
    if status == 429:
        return f"{the} is rate limited (HTTP 429)."
    if status in PASSED_THROUGH_STATUSES:
        return f"{the} refused the request (HTTP {status})."
    if isinstance(exc.__cause__, openai.APITimeoutError):
        return f"{the} timed out."
    if status is not None:
        return f"{the} failed (HTTP {status})."
    if isinstance(exc.__cause__, openai.APIConnectionError) or "stream broke" in str(exc):
        return f"{the} could not be reached, or broke off its answer."
    return f"{the} failed."


def _endpoint_error(exc: EndpointError, secrets: Iterable[str], *, expose: bool, addresses: Mapping[str, str]) -> ProxyError:
    def clean(text: str) -> str:
        text = redact(text, secrets)
        return text if expose else hide_addresses(text, addresses)

    message = clean(str(exc)) if expose else _in_words(exc)
    extra: dict[str, Any] = {"role": exc.role}
    if expose:
        extra["endpoint"] = redact(exc.endpoint, secrets)
    status = exc.status_code
    upstream = _upstream_error(exc) if status in _CALLERS_ERRORS else None
    if upstream is not None:
        fields = {name: upstream.get(name) for name in ("type", "param", "code")}
        others = {name: value for name, value in upstream.items() if name not in ("message", "type", "param", "code")}
        return ProxyError(status, clean(upstream["message"]), **fields, extra={**others, **extra})
    if status in PASSED_THROUGH_STATUSES:
        kind = "rate_limit_error" if status == 429 else "invalid_request_error"
        code = "rate_limit_exceeded" if status == 429 else f"{exc.role}_rejected_request"
        return ProxyError(status, message, type=kind, code=code, headers=_retry_headers(exc), extra=extra)
    if isinstance(exc.__cause__, openai.APITimeoutError):
        return ProxyError(504, message, type="upstream_error", code=f"{exc.role}_timeout", extra=extra)
    if status in (401, 403):
        message = f"{message} (the proxy's credentials for the {exc.role} endpoint were refused)"
    return ProxyError(502, message, type="upstream_error", code=f"{exc.role}_endpoint_error", extra=extra)


def error_from_exception(
    exc: BaseException,
    *,
    secrets: Iterable[str] = (),
    params: Iterable[str] = (),
    expose: bool = False,
    addresses: Mapping[str, str] | None = None,
) -> ProxyError:
    """The error response for `exc`; `params` are the request's parameter names (to fill in `param`);
    `expose`: an upstream's failure names its endpoint and gives its message; else the role alone, and
    `addresses` (address -> role, see `hide_addresses`) are hidden in what an upstream's error object says."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, EndpointError):
        return _endpoint_error(exc, secrets, expose=expose, addresses=addresses or {})
    if isinstance(exc, (ConfigurationError, UnsupportedRequestError)):
        message = redact(str(exc), secrets)
        message = message if expose else hide_addresses(message, addresses or {})
        return ProxyError(400, message, param=guess_param(message, params), code="invalid_request")
    return ProxyError(500, "The proxy failed to handle the request; see its log.", type="server_error", code="internal_error")
