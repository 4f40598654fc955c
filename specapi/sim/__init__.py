"""An OpenAI-format simulated provider, for tests, benchmarks and demos without a real server.

Two n-gram language models over real ``cl100k_base`` tokens stand in for a target (``"sim-target"``) and a
draft (``"sim-draft"``); they agree on code and boilerplate and much less on prose, so speculative
acceptance comes from the text. ``SimProvider`` serves them with the parameters, shapes and refusals of a
chosen server flavour (``"vllm"``, ``"openai"``, ``"llamacpp"``, ``"sglang"``), including the native API
of vLLM, SGLang and llama-server,, a latency profile (``"lan"``,
``"hosted"``, ``"instant"``) and injected faults, and records every call.

    provider = SimProvider(capabilities="vllm", latency="instant")
    client = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x",
                                http_client=httpx2.AsyncClient(transport=SimTransport(provider)))

Modules: ``corpus`` (training text, tokenizer), ``models`` (the n-gram models), ``template`` (chat
template), ``generation`` (sampling and scoring), ``latency`` (timing, prices, cache, rate limit),
``profiles`` (server capabilities), ``faults``, ``params`` (request fields), ``responses`` (JSON shapes),
``streams`` (SSE), ``jobs`` (prompts run and their results), ``vllm_api`` / ``sglang_api`` /
``llamacpp_api`` (native endpoints), ``provider`` (knows no adapter; callers wrap it), ``transport`` (httpx2), ``server`` (ASGI + uvicorn), ``endpoints``
(``simulated_endpoints`` for ``specapi.Endpoint``), ``command`` (``specapi simulate``).
"""

from .corpus import ENCODING_NAME, EOS_TOKEN, EOS_TOKEN_ID, decode_text, encode_text, token_str
from .endpoints import simulated_endpoints
from .faults import FaultPlan, Faults
from .generation import Generation, TokenRecord, generate, score_prompt
from .jobs import Job, PromptWork
from .latency import (
    LATENCY_PROFILES,
    LatencyProfile,
    ManualClock,
    ModelTiming,
    Pricing,
    PrefixCache,
    RecordingSleep,
    RequestTiming,
    batch_timing,
    get_latency_profile,
    request_timing,
)
from .models import MODEL_SPECS, ModelSpec, NGramModel, get_model, model_names
from .profiles import CAPABILITY_PROFILES, Capabilities, get_capabilities
from .provider import Call, CallList, ModelUsage, SimProvider, SimResponse
from .server import create_app, run_server
from .template import render_chat
from .transport import SimTransport

__all__ = [
    "CAPABILITY_PROFILES",
    "ENCODING_NAME",
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "LATENCY_PROFILES",
    "MODEL_SPECS",
    "Call",
    "CallList",
    "Capabilities",
    "FaultPlan",
    "Faults",
    "Generation",
    "Job",
    "LatencyProfile",
    "ManualClock",
    "ModelSpec",
    "ModelTiming",
    "ModelUsage",
    "NGramModel",
    "PrefixCache",
    "PromptWork",
    "Pricing",
    "RecordingSleep",
    "RequestTiming",
    "SimProvider",
    "SimResponse",
    "SimTransport",
    "TokenRecord",
    "batch_timing",
    "create_app",
    "decode_text",
    "encode_text",
    "generate",
    "get_capabilities",
    "get_latency_profile",
    "get_model",
    "model_names",
    "render_chat",
    "request_timing",
    "run_server",
    "score_prompt",
    "simulated_endpoints",
    "token_str",
]
