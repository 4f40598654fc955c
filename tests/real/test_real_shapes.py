"""The recorded llama-server shapes (tests/fixtures/llamacpp/, which the simulator is tested against)
still hold on the real server: recorded again here and compared key by key, type by type."""

from __future__ import annotations

import json
import pathlib
import sys

from real_helpers import ServerPair
from record_shapes import record_from

TESTS = pathlib.Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from shapes import FIXTURES, assert_same_shape  # noqa: E402


def test_the_recorded_fixtures_match_the_server(ls: ServerPair, tmp_path: pathlib.Path) -> None:
    record_from(ls.target.root, tmp_path)
    committed = sorted(p.name for p in (FIXTURES / "llamacpp").glob("*.json"))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == committed
    for name in committed:
        fresh = json.loads((tmp_path / name).read_text(encoding="utf-8"))
        kept = json.loads((FIXTURES / "llamacpp" / name).read_text(encoding="utf-8"))
        if name == "seed_per_prompt.json":
            assert fresh["identical_prompts_same_tokens"] == fresh["trials"], fresh
            continue
        assert fresh["status"] == kept["status"] == 200, name
        assert_same_shape(fresh["response"], kept["response"])
