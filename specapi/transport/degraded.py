"""One warning per endpoint and failure, through `logging`, when requests fall back to the target alone
because a role failed: a draft model that does not exist, a draft server that is down, a target answer
that cannot be verified against. Each response says so (`speculative.fallback_reason`); the log says
it once per endpoint and kind of failure, so that a misconfiguration is seen without flooding the log.

The warnings go to the `specapi` logger (Python's last-resort handler prints them on stderr when the
program configures no logging).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict

from ._exceptions import EndpointError

__all__ = ["FallbackWarnings", "logger"]

logger = logging.getLogger("specapi")

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
#: Distinct (endpoint, failure) pairs remembered; the oldest are forgotten (and warned of again) past it.
_REMEMBERED = 256

_CONSEQUENCE = {
    "draft": "requests go on with the target alone: the same output, without the speed-up of drafts",
    "target": "its answers could not be verified against: requests go on with the target alone, without speculation",
}


class FallbackWarnings:
    """Remembers which failures were logged (shared by the copies of a client, `with_options`)."""

    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[str, str, str, int | None], None] = OrderedDict()
        self._lock = threading.Lock()

    def failed(self, exc: EndpointError) -> bool:
        """Log `exc` as the reason of a fallback unless the same endpoint failed the same way before;
        True if it was logged."""
        key = (exc.role, exc.endpoint, type(exc).__name__, exc.status_code)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return False
            self._seen[key] = None
            while len(self._seen) > _REMEMBERED:
                self._seen.popitem(last=False)
        consequence = _CONSEQUENCE.get(exc.role, _CONSEQUENCE["target"])
        text = _URL_CREDENTIALS.sub(r"\g<scheme>***@", str(exc))
        logger.warning("%s; %s. Each response's speculative.fallback_reason says so; logged once per endpoint and failure.", text, consequence)
        return True
