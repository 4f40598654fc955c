"""The proxy's routes: OpenAI's `/v1/completions` and `/v1/chat/completions`, served with speculation.

    POST /v1/completions, POST /v1/chat/completions   JSON, or SSE with `"stream": true`
    GET  /v1/models, /v1/models/{id}                  the target model, then the others its server lists (`served.py`)
    GET  /health                                      liveness (no authentication, no upstream call)
    GET  /ready                                       readiness: 503 while the target is unreachable; each role's
                                                      state ("degraded" while the draft fails) (`readiness.py`)
    GET  /metrics                                     Prometheus text format (no authentication)
    any other route, any method                       passed to the target unchanged (`forward.py`): /v1/embeddings,
                                                      /v1/responses, vLLM's /tokenize, ... (streams relayed as they come)

Responses are the openai SDK's own objects dumped as they were built (`exclude_unset`, so explicit
`null`s stay and nothing is invented), plus `"speculative": stats.to_dict()` at the top level (in the
last chunk of a stream) and `x-specapi-*` headers. A client that disconnects cancels the upstream work.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import hashlib
import hmac
import logging
import os
import re
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..transport._exceptions import EndpointError, MalformedResponseError
from ..surface.client import AsyncSpeculativeOpenAI
from ..transport._calls import Meter, RoleClient
from ..surface.checks import EndpointChecker
from ..core.stats import SpeculativeStats
from ..parts.suffix import SuffixIndex
from ..surface.streaming import SpeculativeStream
from .asgi import ProxyApp, http_error
from .arguments import CHAT_FIELDS, COMPLETION_FIELDS, chat_arguments, completion_arguments, parse_json_object, read_body
from .config import ServerConfig
from .disconnect import ClientDisconnected, run_unless_disconnected
from .errors import ProxyError, error_from_exception, hide_addresses, redact
from .forward import forward
from .headers import stats_headers
from .metrics import CONTENT_TYPE, ProxyMetrics
from .peers import Peers
from ..share import RedisShare
from .readiness import CHECK_TIMEOUT, Readiness
from .relay import TargetStream, handed_over_stream, relayed_stream, stream_path
from .served import ServedModels
from .sse import DONE_EVENT, EventStreamResponse, encode_event

__all__ = ["create_app", "build_client", "CLIENT_CLOSED_REQUEST"]

logger = logging.getLogger("specapi.server")

#: Status recorded (nginx's convention) when the client left before any response was sent.
CLIENT_CLOSED_REQUEST = 499

#: How long startup waits for the target's probe before serving anyway (the probe goes on meanwhile).
STARTUP_PROBE_WAIT_S = 5.0

#: The route label of every request passed to the target unchanged (one label: the paths are the clients').
FORWARDED_ROUTE = "passthrough"
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _error_response(error: ProxyError, request_id: str) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers={**error.headers, "x-request-id": request_id})


def _dump(model: Any) -> dict[str, Any]:
    """An SDK object as the JSON it was built from (its `speculative` attribute travels separately)."""
    return model.model_dump(mode="json", exclude_unset=True, exclude={"speculative"})


def _wants_usage(kwargs: dict[str, Any]) -> bool:
    """The caller asked for the usage chunk at the stream's end (`stream_options.include_usage`)."""
    options = kwargs.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def build_client(config: ServerConfig) -> AsyncSpeculativeOpenAI:
    """The speculative client `config` describes (raises `ConfigurationError` for unknown options)."""
    options = {"suffix_index": SuffixIndex(max_tokens=config.suffix_max_tokens), **config.client_options}
    return AsyncSpeculativeOpenAI(target=config.target, draft=config.draft, num_speculative_tokens=config.num_speculative_tokens, **options)


class _Proxy:
    """The state one app shares between requests: configuration, the speculative client, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = ProxyMetrics(model=config.target.model)
        self.metrics.ready.set(0)
        self.secrets = config.secrets
        #: Where the upstreams are, by role: hidden from clients unless `expose_upstream_errors`.
        self.addresses = {} if config.expose_upstream_errors else config.addresses
        #: `redact` with this proxy's secrets (and the upstreams' addresses hidden), remembered: the same few
        #: reasons go out with every response.
        self.scrub: Callable[[str], str] = functools.lru_cache(maxsize=256)(
            lambda text: hide_addresses(redact(text, self.secrets), self.addresses)
        )
        self.readiness: Readiness | None = None
        #: The other processes serving this port, told what this one's suffix indexes learn (`peers.py`).
        self.peers: Peers | None = None
        #: The other replicas, through Redis (`specapi.share`), with `--share`.
        self.share: RedisShare | None = None
        #: Verification off: every stream is one call of the target's, relayed as it comes (`relay.py`).
        self.relays = config.client_options.get("verification") == "none"
        self._tenants: OrderedDict[str, AsyncSpeculativeOpenAI] = OrderedDict()
        self._client: AsyncSpeculativeOpenAI | None = self._build_client()  # validates the configuration now
        #: Every model of the target's server: a request may name any of them, as `model=` on the clients.
        self.served = ServedModels(config.target.model, self._list_target_models, clock=config.clock)

    async def _list_target_models(self) -> list[str]:
        page = await self.client.models.list()
        return [model.id for model in page.data]

    def _build_client(self) -> AsyncSpeculativeOpenAI:
        self._tenants.clear()
        client = build_client(self.config)
        client._runtime.on_learn = functools.partial(self._tell_peers, "")
        client._runtime.relay_alone = True  # whole answers left to the target alone are relayed (`relay.py`)
        return client

    @property
    def client(self) -> AsyncSpeculativeOpenAI:
        if self._client is None:  # after a shutdown, a restarted app builds a fresh client
            self._client = self._build_client()
        return self._client

    def client_for(self, request: Request) -> AsyncSpeculativeOpenAI:
        """The client serving `request`: the shared one, or (suffix scope "api-key") a copy with the
        suffix index of the key the request presented. Copies share connections and the policy."""
        if self.config.suffix_scope != "api-key":
            return self.client
        _, _, given = request.headers.get("authorization", "").partition(" ")
        return self._tenant(hashlib.sha256(given.strip().encode()).hexdigest())

    def _tenant(self, tenant: str) -> AsyncSpeculativeOpenAI:
        """The client of one API key (by its hash), made on first use; the least recently used go."""
        client = self._tenants.get(tenant)
        if client is None:
            client = self.client.with_options(suffix_index=SuffixIndex(max_tokens=self.config.suffix_max_tokens))
            client._runtime.on_learn = functools.partial(self._tell_peers, tenant)
            client._runtime.relay_alone = True
            self._tenants[tenant] = client
            while len(self._tenants) > self.config.max_tenants:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant)
        return client

    # -- sharing what the suffix indexes learn with the other processes (`peers.py`)

    def _tell_peers(self, tenant: str, model: str, tokens: list[int]) -> None:
        if self.peers is not None:
            self.peers.publish(f"{tenant}\n{model}", tokens)
        if self.share is not None:
            self.share.publish(f"{tenant}\n{model}", tokens)

    def _learnt_by_peer(self, scope: str, tokens: list[int]) -> None:
        tenant, _, model = scope.partition("\n")
        if bool(tenant) != (self.config.suffix_scope == "api-key"):
            return  # a process configured otherwise: its scopes are not this one's
        client = self._tenant(tenant) if tenant else self.client
        runtime = client._runtime
        if runtime.learning:
            runtime.suffix_for(model).add(tokens)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.readiness = self._readiness()
        watcher = asyncio.ensure_future(self.readiness.run())
        await self.client._warm()  # not in the middle of the first requests' streams
        if self.config.peers_dir is not None:
            self.peers = Peers(self.config.peers_dir, self._learnt_by_peer)
            self.peers.start()
        app.state.peers = self.peers
        if self.config.share_url is not None:
            self.metrics.share_degraded.set(0)
            self.share = RedisShare(
                self.config.share_url, deliver=self._learnt_by_peer, max_entries=self.config.share_max_entries,
                on_degraded=lambda degraded: self.metrics.share_degraded.set(int(degraded)),
                on_count=lambda kind, amount: self.metrics.child(self.metrics.share_records, kind).inc(amount),
            )
            await self.share.warm_client(self.client)  # the policy's measurements, the probe's findings
            await self.share.start()  # the suffix sequences the stream holds, then in the background
        app.state.share = self.share
        # The target's capabilities too: otherwise a burst's first requests all wait for the first one's
        # probe (each worker's, under --workers N). Not for long if the target does not answer: the
        # probe then goes on in the background, or the first request probes again.
        meter = Meter(self.config.target)
        probe = asyncio.ensure_future(self.client._probe(meter))
        probe.add_done_callback(lambda _: self.metrics.upstream("target", meter.snapshot()))  # no response carries them
        listing = asyncio.ensure_future(self.served.refresh(force=True))
        await asyncio.wait((probe, listing), timeout=STARTUP_PROBE_WAIT_S)
        frozen = self.config.freeze_gc
        if frozen:
            gc.collect()
            gc.freeze()
        self.metrics.workers.set(1)
        try:
            yield
        finally:
            self.metrics.workers.set(0)
            if frozen:
                gc.unfreeze()
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)  # its calls counted before the metrics retire
            await self.served.close()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.readiness = None
            if self.peers is not None:
                self.peers.close()
                self.peers = None
            if self.share is not None:
                await self.share.close()
                self.share = None
            self.metrics.ready.set(0)
            self.metrics.retire()
            client, self._client = self._client, None
            if client is not None:
                await client.close()

    def _readiness(self) -> Readiness:
        """The checks behind `/ready`: the target's (or the configured one), and the draft's if there is one.
        Their one-token requests (a model the server does not list) are billed in `/metrics`."""
        runtime = self.client._runtime

        def checker(role: RoleClient) -> EndpointChecker:
            return EndpointChecker(role, timeout=CHECK_TIMEOUT, on_usage=lambda usage: self.metrics.upstream(role.role, usage))

        check = self.config.readiness_check or checker(runtime.target)
        others = {"draft": checker(runtime.draft)} if runtime.draft is not None else {}
        return Readiness(
            check, interval=self.config.readiness_interval, others=others,
            on_change=lambda ready: self.metrics.ready.set(int(ready)), on_role=self._role_changed,
        )

    def _role_changed(self, role: str, problem: str | None) -> None:
        """Said once per change in the log: a role that fails, and one that answers again."""
        if problem is None:
            logger.info("the %s endpoint answers again", role)
        elif role == "target":
            logger.warning("%s; /ready answers 503 until it answers", redact(problem, self.secrets))  # the log has the addresses
        else:
            logger.warning(
                "%s; the proxy serves with the target alone (no speculation from the %s) until it answers", redact(problem, self.secrets), role
            )

    def _watch_failure(self, exc: BaseException) -> None:
        """A target failure that may mean the target is gone (no answer, a timeout, a 5xx): check readiness now."""
        if self.readiness is None or not isinstance(exc, EndpointError) or isinstance(exc, MalformedResponseError):
            return
        if exc.role == "target" and (exc.status_code is None or exc.status_code >= 500):
            self.readiness.suspect(self.scrub(f"a request failed on the target: {exc}")[:300])

    def summary(self, stats: SpeculativeStats) -> dict[str, Any]:
        summary = stats.to_dict()
        for name in ("fallback_reason", "exact_reason"):
            if summary.get(name):
                summary[name] = self.scrub(summary[name])
        return summary

    # -- request plumbing

    def _request_id(self, request: Request) -> str:
        given = request.headers.get("x-request-id", "")
        return given if _REQUEST_ID.match(given) else f"req_{os.urandom(16).hex()}"

    def _authenticate(self, request: Request) -> None:
        expected = self.config.api_key
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            raise ProxyError(
                401,
                "Incorrect or missing API key: send `Authorization: Bearer <key>` with this proxy's key.",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )

    # -- generation routes

    async def completions(self, request: Request) -> Response:
        def arguments(body: dict[str, Any]) -> dict[str, Any]:
            return completion_arguments(
                body, model=self.config.target.model, max_tokens_limit=self.config.max_tokens_limit, served=self.served.names
            )

        def create(**kwargs: Any) -> Awaitable[Any]:
            return self.client_for(request).completions.create(**kwargs)

        return await self._generate(request, "/v1/completions", arguments, create, COMPLETION_FIELDS)

    async def chat_completions(self, request: Request) -> Response:
        def arguments(body: dict[str, Any]) -> dict[str, Any]:
            return chat_arguments(
                body, model=self.config.target.model, max_tokens_limit=self.config.max_tokens_limit, served=self.served.names
            )

        def create(**kwargs: Any) -> Awaitable[Any]:
            return self.client_for(request).chat.completions.create(**kwargs)

        return await self._generate(request, "/v1/chat/completions", arguments, create, CHAT_FIELDS)

    async def _generate(
        self,
        request: Request,
        route: str,
        arguments: Callable[[dict[str, Any]], dict[str, Any]],
        create: Callable[..., Awaitable[Any]],
        fields: frozenset[str],
    ) -> Response:
        started = self.config.clock()
        request_id = self._request_id(request)
        params: frozenset[str] | set[str] = fields
        self.metrics.in_flight.inc()
        handed_over = False
        try:
            self._authenticate(request)
            body = parse_json_object(await read_body(request, self.config.max_request_bytes))
            params = fields | set(body)
            await self.served.knows(body.get("model"))  # a model the target's server added since the last listing
            kwargs = arguments(body)
            if kwargs.get("stream"):
                if self.relays:  # every stream is the target's alone: relayed, not rebuilt (`relay.py`)
                    response = await self._start_relay(request, route, kwargs, started, request_id)
                else:
                    response = await self._start_stream(request, route, create, kwargs, started, request_id)
                handed_over = True  # the stream's on_close records the outcome and the gauge
                return response
            result = await run_unless_disconnected(create(**kwargs), request.receive)
        except (ClientDisconnected, ClientDisconnect):
            self.metrics.child(self.metrics.disconnects, route).inc()
            self.metrics.request(route, CLIENT_CLOSED_REQUEST)
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it; the server drops it
        except Exception as exc:
            return self._fail(route, exc, request_id, params)
        finally:
            if not handed_over:
                self.metrics.in_flight.dec()
        stats: SpeculativeStats = result.speculative
        data = _dump(result)
        data["speculative"] = self.summary(stats)
        elapsed = self.config.clock() - started
        self.metrics.request(route, 200)
        self.metrics.child(self.metrics.duration, route).observe(elapsed)
        if stats.ttft_s is not None:
            self.metrics.child(self.metrics.ttft, route).observe(elapsed - stats.wall_s + stats.ttft_s)
        self.metrics.observe(route, stats)
        return JSONResponse(data, headers={**stats_headers(stats, self.scrub), "x-request-id": request_id})

    def _error(self, exc: BaseException, params: frozenset[str] | set[str] = frozenset()) -> ProxyError:
        return error_from_exception(
            exc, secrets=self.secrets, params=params, expose=self.config.expose_upstream_errors, addresses=self.addresses
        )

    def _fail(self, route: str, exc: BaseException, request_id: str, params: frozenset[str] | set[str]) -> JSONResponse:
        self._watch_failure(exc)
        error = self._error(exc, params)
        if error.status >= 500:
            log = logger.exception if error.status == 500 else logger.warning
            log("request %s on %s failed: %s", request_id, route, redact(str(exc), self.secrets), exc_info=error.status == 500)
        elif isinstance(exc, EndpointError):  # the upstream's address and message, which the client was not told
            logger.info("request %s on %s: %s", request_id, route, redact(str(exc), self.secrets))
        self.metrics.request(route, error.status)
        return _error_response(error, request_id)

    async def _start_stream(
        self,
        request: Request,
        route: str,
        create: Callable[..., Awaitable[Any]],
        kwargs: dict[str, Any],
        started: float,
        request_id: str,
    ) -> Response:
        """Wait for the first chunk (so that early failures get a real HTTP status), then stream the rest.
        A whole answer the engine leaves to the target alone is relayed as the target writes it (`relay.py`)."""
        stream: SpeculativeStream[Any] = await create(**kwargs)
        try:
            first = await run_unless_disconnected(stream.next_data(), request.receive)
            if stream.handover is not None:
                relay = handed_over_stream(stream, stream.handover, wanted_usage=_wants_usage(kwargs))
                return await self._relay_response(request, route, relay, started, request_id)
        except BaseException:
            await stream.close()
            raise
        self.metrics.child(self.metrics.ttft, route).observe(self.config.clock() - started)

        async def close(disconnected: bool) -> None:
            # After the response's last bytes: a stream's end does not wait for its bookkeeping.
            try:
                self._closed(route, stream.speculative, disconnected, started)
            finally:
                await stream.close()  # cancels whatever upstream call is still in flight; the client learns

        events = self._events(route, stream, first, request_id)
        return EventStreamResponse(events, headers={"x-request-id": request_id}, on_close=close)

    def _closed(self, route: str, stats: SpeculativeStats | None, disconnected: bool, started: float) -> None:
        """A stream's books, once its response has ended (its status line went out before the first chunk)."""
        if stats is not None:  # the generation finished: its calls count, whoever left
            self.metrics.observe(route, stats)
            if not disconnected:
                self.metrics.child(self.metrics.duration, route).observe(self.config.clock() - started)
        if disconnected:
            self.metrics.child(self.metrics.disconnects, route).inc()
        self.metrics.request(route, 200)
        self.metrics.in_flight.dec()

    async def _events(
        self, route: str, stream: SpeculativeStream[Any], first: dict[str, Any] | None, request_id: str
    ) -> AsyncGenerator[bytes, None]:
        """The stream as SSE events; the last chunk gets `"speculative"`; errors become an error event.
        Chunks go on as the JSON objects they are built from (no SDK object per chunk). The chunk that
        carries the statistics is the last: `[DONE]` follows it at once, and what is left to do (the
        metrics, the client's learning) waits for the stream's close."""
        try:
            data = first
            while data is not None:
                last = stream.speculative is not None  # set by the last chunk, which carries them
                if last:
                    data["speculative"] = self.summary(stream.speculative)
                yield encode_event(data)
                if last:
                    break
                data = await stream.next_data()
            yield DONE_EVENT
        except Exception as exc:  # after the headers: the error travels as an event (the SDK raises it)
            yield self._stream_error(route, exc, request_id)

    async def _start_relay(self, request: Request, route: str, kwargs: dict[str, Any], started: float, request_id: str) -> Response:
        """`_start_stream` with verification off: the caller's request goes to the target, relayed (`relay.py`)."""
        role, _ = self.client_for(request)._runtime.target_for(kwargs.get("model") or self.config.target.model)
        body = {name: value for name, value in kwargs.items() if name not in ("extra_body", "model")}
        body.update(kwargs.get("extra_body") or {})
        relay = relayed_stream(role, stream_path(route), body, clock=self.config.clock, started=started)
        return await self._relay_response(request, route, relay, started, request_id)

    async def _relay_response(self, request: Request, route: str, relay: TargetStream, started: float, request_id: str) -> Response:
        """The relayed stream's response, once its first chunks have come (early failures get a real status)."""
        try:
            first = await run_unless_disconnected(relay.next_batch(), request.receive)
        except BaseException:
            await relay.aclose()
            raise
        self.metrics.child(self.metrics.ttft, route).observe(self.config.clock() - started)

        async def close(disconnected: bool) -> None:
            try:
                self._closed(route, relay.speculative, disconnected, started)
            finally:
                await relay.aclose()

        events = self._relayed(route, relay, first, request_id)
        return EventStreamResponse(events, headers={"x-request-id": request_id}, on_close=close)

    async def _relayed(
        self, route: str, stream: TargetStream, first: list[dict[str, Any]] | None, request_id: str
    ) -> AsyncGenerator[bytes, None]:
        """The relayed chunks as SSE events, those that arrived together in one write; the last carries
        `"speculative"`, and `[DONE]` follows it in the same write."""
        try:
            batch = first
            while batch is not None:
                if stream.speculative is not None:
                    batch[-1]["speculative"] = self.summary(stream.speculative)
                    yield b"".join(map(encode_event, batch)) + DONE_EVENT
                    return
                yield b"".join(map(encode_event, batch))
                batch = await stream.next_batch()
            yield DONE_EVENT
        except Exception as exc:
            yield self._stream_error(route, exc, request_id)

    def _stream_error(self, route: str, exc: Exception, request_id: str) -> bytes:
        """A failure after the headers: the error travels as an event (the SDK raises it)."""
        self._watch_failure(exc)
        error = self._error(exc)
        logger.warning("stream %s on %s failed: %s", request_id, route, redact(str(exc), self.secrets))
        self.metrics.child(self.metrics.stream_errors, route).inc()
        return encode_event(error.body())

    # -- other routes

    async def models(self, request: Request) -> Response:
        try:
            self._authenticate(request)
        except ProxyError as error:
            return self._fail("/v1/models", error, self._request_id(request), frozenset())
        await self.served.refresh()
        self.metrics.request("/v1/models", 200)
        return JSONResponse({"object": "list", "data": [self._model_card(name) for name in self.served.names]})

    async def model(self, request: Request) -> Response:
        request_id = self._request_id(request)
        try:
            self._authenticate(request)
            name = request.path_params["model"]
            if not await self.served.knows(name):
                raise ProxyError(404, f"The model `{name}` does not exist on this proxy.", param="model", code="model_not_found")
        except ProxyError as error:
            return self._fail("/v1/models/{model}", error, request_id, frozenset())
        self.metrics.request("/v1/models/{model}", 200)
        return JSONResponse(self._model_card(name))

    @staticmethod
    def _model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "specapi"}

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        readiness = self.readiness
        if readiness is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        roles = {
            role: {"status": "ok"} if problem is None else {"status": "failing", "reason": self.scrub(problem)}
            for role, problem in readiness.roles.items()
        }
        if readiness.ready:
            # Sharing is best effort: degraded, the replica serves as well, only without the others' learning.
            sharing = {} if self.share is None else {"sharing": "degraded" if self.share.degraded else "ok"}
            return JSONResponse({"status": "degraded" if readiness.degraded else "ready", "roles": roles, **sharing})
        return JSONResponse({"status": "unready", "reason": self.scrub(readiness.reason or ""), "roles": roles}, status_code=503)

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def passed_on(self, request: Request) -> Response:
        """A route the proxy does not speculate: the target's answer, unchanged (`forward.py`)."""
        request_id = self._request_id(request)
        try:
            self._authenticate(request)
            body = await read_body(request, self.config.max_request_bytes)
            response = await forward(
                self.client._runtime.target, request.method, request.url.path, request.url.query, request.headers.items(), body
            )
        except Exception as exc:
            return self._fail(FORWARDED_ROUTE, exc, request_id, frozenset())
        self.metrics.request(FORWARDED_ROUTE, response.status_code)
        return response


def create_app(config: ServerConfig) -> Starlette:
    """An ASGI app serving `config` (run it with uvicorn, or `specapi serve`)."""
    proxy = _Proxy(config)
    routes = [
        Route("/v1/completions", proxy.completions, methods=["POST"]),
        Route("/v1/chat/completions", proxy.chat_completions, methods=["POST"]),
        Route("/v1/models", proxy.models, methods=["GET"]),
        Route("/v1/models/{model:path}", proxy.model, methods=["GET"]),
        Route("/health", proxy.health, methods=["GET"]),
        Route("/ready", proxy.ready, methods=["GET"]),
        Route("/metrics", proxy.metrics_page, methods=["GET"]),
        Route("/{path:path}", proxy.passed_on, methods=_ALL_METHODS),
    ]
    generation = {"/v1/completions": proxy.completions, "/v1/chat/completions": proxy.chat_completions}
    app = ProxyApp(generation=generation, routes=routes, lifespan=proxy.lifespan, exception_handlers={HTTPException: http_error})
    app.state.metrics = proxy.metrics
    app.state.config = config
    return app
