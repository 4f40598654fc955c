"""`client.models`: the target's `/v1/models`, passed through (`list`, `retrieve`).

Failures raise the same errors as generation (`TargetNotFoundError` is both a `TargetError` and an
`openai.NotFoundError`, ...).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import openai
from openai.pagination import AsyncPage
from openai.types import Model

from ._calls import RoleClient

__all__ = ["AsyncModels"]

T = TypeVar("T")


class AsyncModels:
    """The models the target's server offers."""

    def __init__(self, target: RoleClient) -> None:
        self._target = target

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except openai.APIStatusError as exc:
            raise self._target.error(f"HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code, cause=exc) from exc
        except openai.APIError as exc:
            raise self._target.error(f"{type(exc).__name__}: {exc}", cause=exc) from exc

    async def list(self, **options: Any) -> AsyncPage[Model]:
        """The target's `GET /models` (`options`: the SDK's `extra_headers`, `extra_query`, `timeout`)."""
        return await self._call(lambda: self._target.sdk.models.list(**options))

    async def retrieve(self, model: str, **options: Any) -> Model:
        """The target's `GET /models/{model}`."""
        return await self._call(lambda: self._target.sdk.models.retrieve(model, **options))
