"""The architecture of docs/design.md §2, checked on the source: the package's import graph
has no cycle, and imports only point downward through the layers.

The graph is read from the source with `ast`, every import counted: at module level, inside
functions, and under `if TYPE_CHECKING:`. An import of `a.b.c` also imports the package
`a.b` (its `__init__` runs first), except the root package, whose `__init__` only
re-exports the public names, and the importing module's own packages, already imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "graphsafe_sampler"

# Lowest first: a module may import modules of its own layer or below, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("kernels", ("kernels",)),
    (
        "data",
        ("params", "config", "batch_update", "output", "bitmask", "staging", "rng", "vocab_shard"),
    ),
    ("state", ("slot_tables", "batch_state", "recent_tokens")),
    ("processors", ("processors",)),
    ("stages", ("stages",)),
    ("pipelines", ("pipelines",)),
    ("samplers", ("sampler", "rejection_sampler", "prompt_logprobs", "compile_options")),
    ("parallel", ("distributed",)),
    ("tools", ("testing", "bench", "examples", "demo", "cli", "__main__")),
]


def _source_files() -> dict[str, Path]:
    """Module name -> file, for the package and kernels/ (installed as its subpackage)."""
    files = {}
    for base, prefix in ((ROOT / PACKAGE, PACKAGE), (ROOT / "kernels", f"{PACKAGE}.kernels")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join([prefix, *parts])] = path
    return files


def _packages(files: dict[str, Path]) -> set[str]:
    return {name for name, path in files.items() if path.name == "__init__.py"}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (see the module docstring)."""
    files = _source_files()
    packages = _packages(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if name in packages else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                targets.add(module)
                # `from pkg import sub` imports the submodule pkg.sub
                targets.update(f"{module}.{alias.name}" for alias in node.names)
        edges = set()
        for target in targets:
            if target not in files:
                continue
            edges.add(target)
            parts = target.split(".")
            for i in range(2, len(parts)):  # the packages above it, the root excepted,
                above = ".".join(parts[:i])
                if not (name == above or name.startswith(f"{above}.")):  # and not our own:
                    edges.add(above)  # they were imported before this module

        edges.discard(name)
        graph[name] = edges
    return graph


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a package module, or None for the root `__init__`."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    for index, (_, members) in enumerate(LAYERS):
        if parts[1] in members:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.sampler" in graph and f"{PACKAGE}.kernels.sampling" in graph
    # the parser sees the imports the tests below rely on
    assert f"{PACKAGE}.pipelines" in graph[f"{PACKAGE}.sampler"]
    assert f"{PACKAGE}.kernels.library" in graph[f"{PACKAGE}.kernels.sampling"]
    assert f"{PACKAGE}.stages.grammar" in graph[f"{PACKAGE}.rejection_sampler"]


def test_no_import_cycle() -> None:
    assert _cycles(import_graph()) == []


def test_imports_point_downward() -> None:
    upward = []
    for module, targets in import_graph().items():
        layer = layer_of(module)
        for target in targets:
            target_layer = layer_of(target)
            if layer is not None and target_layer is not None and target_layer > layer:
                upward.append(f"{module} ({LAYERS[layer][0]}) imports {target} "
                              f"({LAYERS[target_layer][0]})")  # fmt: skip
    assert upward == []


def test_kernels_import_nothing_from_the_package() -> None:
    graph = import_graph()
    kernels = f"{PACKAGE}.kernels"
    outside = {
        (module, target)
        for module, targets in graph.items()
        if module.startswith(kernels)
        for target in targets
        if not target.startswith(kernels)
    }
    assert outside == set()


@pytest.mark.parametrize(
    ("graph", "cyclic"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
    ids=["two", "three", "none"],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], cyclic: list[list[str]]) -> None:
    assert _cycles(graph) == cyclic


def test_no_module_over_600_lines_outside_tests() -> None:
    long = {}
    for base in ("graphsafe_sampler", "kernels", "perf"):
        for path in (ROOT / base).rglob("*.py"):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > 600:
                long[str(path.relative_to(ROOT))] = lines
    assert long == {}
