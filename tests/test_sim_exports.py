"""The public surface of specapi.sim: what __all__ names exists, in the package and in each module."""

import importlib

import pytest

import specapi.sim

MODULES = [
    "corpus", "faults", "generation", "latency", "models", "params", "profiles", "provider", "responses",
    "server", "streams", "template", "transport", "command", "endpoints",
]


def test_package_exports_exist():
    for name in specapi.sim.__all__:
        assert hasattr(specapi.sim, name), name
    assert sorted(specapi.sim.__all__) == sorted(set(specapi.sim.__all__))


@pytest.mark.parametrize("module", MODULES)
def test_module_exports_exist_and_have_docstrings(module):
    mod = importlib.import_module(f"specapi.sim.{module}")
    assert mod.__doc__ and len(mod.__doc__) > 40
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_profile_and_model_names():
    assert {"vllm", "openai", "llamacpp"} <= set(specapi.sim.CAPABILITY_PROFILES)
    assert {"lan", "hosted", "instant"} <= set(specapi.sim.LATENCY_PROFILES)
    assert {"sim-target", "sim-draft"} <= set(specapi.sim.model_names())
