"""The shape of the package, checked from its source: imports go one way, functions stay short, the core
declares its interfaces instead of probing with getattr, and wire fields are named only by dialects.

The layers are the folders of `specapi/`, lowest first in `FOLDERS`; the files at the top are the
package's surface (`__init__`) and its entry points (`cli`, `run_command`, `share`), which sit with
the wings. The import graph is built from every `import` statement of `specapi/` (function-level ones
included, as they are imports all the same); a module may import from its own layer or a lower one,
never from a higher one, and the graph has no circle. A new folder must be placed in `FOLDERS`, and a
new file at the top in `TOP`: the test names it otherwise.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent / "specapi"

#: The layers, lowest first: each is the folders that hold it.
FOLDERS: list[tuple[str, tuple[str, ...]]] = [
    ("core: records, arithmetic and options, no I/O", ("core",)),
    ("transport: one role's HTTP calls, the SDK seam, what a failing call raises", ("transport",)),
    ("dialects: how each server family is asked and answered", ("dialects",)),
    ("parts: verifiers, drafters, policies, paths, the probe", ("parts",)),
    ("engine: one request's life", ("engine",)),
    ("surface: the SDK-shaped clients", ("surface",)),
    ("wings: proxy, bench, simulator, integrations", ("server", "bench", "sim", "integrations")),
]
#: The files at the top of the package, and the layer each belongs to.
TOP = {"specapi": "surface", "cli": "wings", "run_command": "wings", "share": "wings"}
LAYERS = [name.split(":")[0] for name, _ in FOLDERS]

#: The engine and its parts, and the pure core: interfaces are declared here, not probed. (The transport
#: and the surface read the SDK's dynamic objects, where getattr is the interface.)
CORE_LAYERS = {LAYERS.index("parts"), LAYERS.index("engine")}
PURE_CORE = {"core.sampling", "core.alignment", "core.acceptance", "core.lossy", "core.context", "core.load", "core.stats", "core.scoring"}
WIRE_FIELDS = re.compile(r"prompt_logprobs|return_token_ids|continue_final_message|n_probs|top_logprobs|malformed=True")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600
MAX_CORE_PROBES = 10


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _short(module: str) -> str:
    return module.removeprefix("specapi.") if module != "specapi" else "specapi"


def layer_of(module: str) -> int | None:
    """The index in `LAYERS` of the folder that holds `module` (or of a file at the top, by `TOP`)."""
    name = _short(module)
    if name in TOP:
        return LAYERS.index(TOP[name])
    folder = name.split(".")[0]
    for index, (_, folders) in enumerate(FOLDERS):
        if folder in folders:
            return index
    return None


def _imported(module: str, path: pathlib.Path) -> Iterator[str]:
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "specapi")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "specapi":
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                yield submodule if submodule in MODULES else target


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        graph[module] = {m for m in _imported(module, path) if m in MODULES and m != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_a_circle_and_passes_a_line():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_the_import_graph_has_no_circle():
    assert _circles(import_graph()) == []


def test_no_module_imports_from_a_higher_layer():
    upward = [
        f"{_short(m)} ({LAYERS[layer_of(m)]}) imports {_short(d)} ({LAYERS[layer_of(d)]})"  # type: ignore[index]
        for m, deps in import_graph().items()
        for d in sorted(deps)
        if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m)  # type: ignore[operator]
    ]
    assert upward == []


def _outside(*packages: str) -> Iterator[tuple[str, pathlib.Path]]:
    for module, path in MODULES.items():
        if not any(_short(module) == p or _short(module).startswith(p + ".") for p in packages):
            yield module, path


def _lengths() -> dict[str, int]:
    """Functions over `MAX_FUNCTION_LINES` and modules over `MAX_MODULE_LINES` outside the simulator and
    the bench, with their lengths in lines."""
    found = {}
    for module, path in _outside("sim", "bench"):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found[_short(module)] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    found[f"{_short(module)}.{node.name}"] = lines
    return found


def test_no_function_is_over_60_lines_and_no_module_over_600_outside_the_simulator_and_bench():
    assert _lengths() == {}


def _probes(path: pathlib.Path) -> list[tuple[int, str, str]]:
    """getattr/hasattr calls with their line and the comment on that line or the line above."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            comment = here.split("#", 1)[1] if "#" in here else (above[1:] if above.startswith("#") else "")
            found.append((node.lineno, node.func.id, comment.strip()))
    return found


def test_the_core_declares_its_interfaces_instead_of_probing_them():
    core = [(m, p) for m, p in MODULES.items() if layer_of(m) in CORE_LAYERS or _short(m) in PURE_CORE]
    probes = [(m, line, comment) for m, p in core for line, _, comment in _probes(p)]
    assert len(probes) < MAX_CORE_PROBES, probes
    assert [f"{_short(m)}:{line}" for m, line, comment in probes if not comment] == []


def test_only_dialects_name_wire_fields():
    named = [
        f"{_short(module)}:{number}: {line.strip()}"
        for module, path in _outside("dialects", "sim")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if WIRE_FIELDS.search(line)
    ]
    assert named == []


def _private_openai(path: pathlib.Path) -> Iterator[str]:
    """The private openai modules (a name part starting with `_`) a file imports, and private SDK
    attributes it reads after `sdk.` / `openai.` (the SDK client's `_client`, `_make_...`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == "openai" and any(part.startswith("_") for part in parts[1:]):
                yield name
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Attribute) and node.value.attr == "sdk" or (
                isinstance(node.value, ast.Name) and node.value.id in ("sdk", "openai")
            ):
                yield f"sdk.{node.attr}"


def test_private_parts_of_the_sdk_are_reached_from_one_module():
    """`specapi/transport/_sdk.py` is the seam: a private openai import or call anywhere else is named here."""
    found = {_short(m): sorted(set(_private_openai(p))) for m, p in MODULES.items()}
    assert found["transport._sdk"], "the seam itself imports the SDK's private parts (the check reads imports)"
    assert {m: names for m, names in found.items() if names and m != "transport._sdk"} == {}


def test_the_checks_see_the_package():
    """The walks above read the real tree: the engine, a dialect and the client are all there."""
    assert {"specapi.engine.engine", "specapi.dialects.openai", "specapi.surface.client", "specapi"} <= set(MODULES)
    graph = import_graph()
    assert "specapi.engine.engine" in graph["specapi.surface.runtime"] and "specapi.dialects.openai" in graph["specapi.parts.verifiers"]


#: Calls that change a list or dict in place: on a field of the request's state, a write.
_MUTATORS = {"append", "extend", "clear", "pop", "insert", "remove", "update", "setdefault"}


def _state_writes(source: str) -> int:
    """Writes to a `RequestState`'s fields in a module's source: assignments (plain, augmented, to an item) and
    in-place changes of a field, through a parameter annotated `RequestState`, a name bound to
    `RequestState(...)`, or `self` in the class itself."""
    writes = 0

    def field_of(node: ast.AST, names: set[str]) -> bool:
        while isinstance(node, (ast.Subscript, ast.Starred)):
            node = node.value
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names

    def visit(node: ast.AST, in_state: bool) -> None:
        nonlocal writes
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name == "RequestState")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = child.args.posonlyargs + child.args.args + child.args.kwonlyargs
                names = {a.arg for a in arguments if a.annotation is not None and "RequestState" in ast.unparse(a.annotation)}
                names |= {"self"} if in_state else set()
                for n in ast.walk(child):
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "RequestState":
                        names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
                for n in ast.walk(child):
                    if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                        targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
                        for target in targets:
                            elements = target.elts if isinstance(target, ast.Tuple) else [target]
                            writes += sum(field_of(e, names) for e in elements)
                    elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MUTATORS:
                        writes += field_of(n.func.value, names)
            else:
                visit(child, in_state)

    visit(ast.parse(source), False)
    return writes


def test_one_module_writes_a_requests_state():
    """The engine and the target-alone calls hand what happened to `engine/state.py`, which applies it."""
    writers = {_short(m): n for m, p in MODULES.items() if (n := _state_writes(p.read_text(encoding="utf-8")))}
    assert list(writers) == ["engine.state"], writers
    example = "def f(state: RequestState, other):\n    state.a = 1\n    state.b += 1\n    state.c.append(2)\n    x, state.d = 1, 2\n    other.e = 3\n"
    assert _state_writes(example) == 4  # the walk sees each kind of write, and no other object's
