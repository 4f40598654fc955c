"""`specapi serve`: an OpenAI-compatible HTTP proxy that speculates.

Point any OpenAI client at the proxy (`base_url="http://proxy:8000/v1"`, `api_key=<the proxy's key>`):
`/v1/completions` and `/v1/chat/completions` answer with the target model's exact output, produced by
draft-then-verify rounds against the two upstream endpoints. Statistics come back as `x-specapi-*`
headers and as an extra top-level `"speculative"` field (in the last chunk of a stream), which OpenAI
clients ignore. `/metrics` exposes Prometheus metrics, `/health` is a liveness probe, `/ready` a readiness probe (503
while the target is unreachable).

    from specapi.server import ServerConfig, create_app
    app = create_app(ServerConfig(target=Endpoint(...), draft=Endpoint(...), api_key="sk-proxy-..."))
    # uvicorn.run(app, ...), or from the shell: specapi serve --target-base-url ... (see `command`)

Scaling out
-----------
The proxy keeps no per-client state: each request is served from its own body alone, so any replica can
serve any request and no session affinity is needed. What a replica does share between its requests is
one client per upstream role (connection pools) and one memory of verification paths an upstream refused
(so later requests skip them); both rebuild themselves after a restart. To scale:

* Run N identical replicas (same settings, same `SPECAPI_API_KEY`) behind any HTTP load balancer.
  Prefer least-outstanding-requests balancing over round robin: requests last from milliseconds to
  minutes. Turn off response buffering for `text/event-stream` (the proxy sends `X-Accel-Buffering: no`
  for nginx) and set the balancer's idle timeout above the longest generation.
* Use `/health` for liveness (it never calls upstream) and `/ready` for readiness: it answers 503 while
  the target is unreachable (checked in the background and at once after a request fails on the target),
  so an outage takes the replicas out of rotation and its end brings them back.
* Deploys: on SIGTERM a replica stops accepting connections and lets in-flight requests finish for up
  to `--shutdown-timeout` seconds (then cancels them, which cancels their upstream calls). Make the
  orchestrator's grace period longer than that, and take the replica out of the balancer first.
* `--workers N` runs N processes on one port; their metrics add up (prometheus-client's multiprocess
  mode), SIGTERM drains them all. Metrics are per replica: scrape every replica and aggregate with
  `sum by (...)`, e.g. acceptance
  `sum(rate(specapi_accepted_tokens_total[5m])) / sum(rate(specapi_drafted_tokens_total[5m]))`.
* A speculative response costs many upstream calls (a draft and a verification per round; fan-out
  verification sends k + 1 at once), and the proxy's CPU goes mostly to making them (the openai SDK
  and HTTP stack): budget roughly one core per few dozen concurrent streams and scale on CPU, or on
  `specapi_in_flight_requests`. A client that disconnects cancels its upstream work at once.
* Upstream prefix caches warm up per upstream replica; if the upstreams themselves are load-balanced,
  routing by conversation (sticky by user or prompt prefix) there keeps verification prefills cached.
* Upstream API keys stay in the replicas' environment; clients only ever hold the proxy's key.
* Each replica learns from the traffic it serves (the suffix index of finished prompts and outputs,
  capped by `--suffix-max-tokens`; the `--workers` of one replica share it, `peers.py`): replicas
  learn separately unless they share through Redis (`--share redis://...`, `specapi.share`: suffix
  sequences per scope, the policy's measurements and the probe's findings; best effort), else sticky
  routing by tenant or task lets repeated structure reach the replica that has seen it. By default the index is shared by every
  client of the upstream model (`--suffix-scope model`): outputs never depend on it, but response
  times do, so a client could time requests to learn that some text was recently seen by another.
  `--suffix-scope api-key` keeps one index per client key, closing that channel.
"""

from .app import create_app
from .background import BackgroundServer
from .config import ServerConfig

__all__ = ["create_app", "ServerConfig", "BackgroundServer"]
