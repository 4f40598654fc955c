"""`specapi bench`: measure whether a draft/target pair pays off against the target alone, and why.

Modules: ``scenarios`` (what to run: built-in simulator scenarios, prompts files), ``runner`` (the same
requests through the target alone and through specapi, alternating), ``predict`` (docs/performance.md's
arithmetic as pure functions: E(K), round cost, best draft length, break-even acceptance), ``summary``
(figures, prediction and exactness per scenario: the JSON report), ``explain`` (the explanation per
scenario), ``report`` (the rich terminal table), ``html`` (a self-contained HTML report with plots),
``command`` (the CLI subcommand).
"""

from .predict import (
    LatencyModel,
    Prediction,
    best_draft_length,
    break_even_acceptance,
    conditional_acceptance,
    expected_tokens,
    expected_tokens_by_position,
    predicted_speedup,
)
from .runner import ScenarioRun, run_scenario
from .scenarios import DEFAULT_SCENARIOS, SCENARIOS, BenchRequest, Scenario, SimSetup, load_prompts
from .summary import REQUIRED_KEYS, SIDE_KEYS, report, summarize

__all__ = [
    "BenchRequest",
    "DEFAULT_SCENARIOS",
    "LatencyModel",
    "Prediction",
    "REQUIRED_KEYS",
    "SCENARIOS",
    "SIDE_KEYS",
    "Scenario",
    "ScenarioRun",
    "SimSetup",
    "best_draft_length",
    "break_even_acceptance",
    "conditional_acceptance",
    "expected_tokens",
    "expected_tokens_by_position",
    "load_prompts",
    "predicted_speedup",
    "report",
    "run_scenario",
    "summarize",
]
