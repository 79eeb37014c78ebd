"""The layout holds: imports point down the flow (costmodel → space → search → study/report →
cli) with no cycle between modules, no module grows past ~400 lines, and every example in
the command help names files that exist."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from solver.cli.app import cli

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("costmodel", "solver")

# Layers in the order data flows, lowest first; a module may import its own layer and the ones
# below it. costmodel/ by role: the base (errors, the numeric backends, input units and bounds),
# the space's dimensions and rules, the inputs (every schema a user writes, with its reader),
# the terms (the formulas and the problem's constants they read), evaluation, and what scores
# or fits the model against measurements (runs, calibration, the frameworks' files). A layer of
# several packages lists them together: they may import each other, module cycles aside.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("costmodel.errors", "costmodel.ops", "costmodel.inputs.limits", "costmodel.inputs.units", "costmodel.inputs.fields"),
    ("costmodel.space",),
    ("costmodel.inputs",),
    ("costmodel.terms",),
    ("costmodel",),
    ("costmodel.measured", "costmodel.calibration", "costmodel.frameworks"),
    ("solver.space",),
    ("solver.search",),
    ("solver.study", "solver.report"),
    ("solver.cli",),
)
# study and report sit side by side: report may not read study, study may use report's JSON helpers.
ALLOWED_SIDEWAYS = {("solver.study", "solver.report")}
MAX_MODULE_LINES = 420


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` reads the module; `from module import name` the module
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names]
        for name in names:
            if name in modules:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _layer(module: str) -> tuple[int, str]:
    """(rank, the layer's package or module) of a module: its longest matching prefix."""
    return max(((rank, prefix) for rank, layer in enumerate(LAYERS) for prefix in layer
                if module == prefix or module.startswith(prefix + ".")), key=lambda found: len(found[1]))


def test_module_imports_have_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}   # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " → ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def _against_the_flow(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imported in graph.items():
        if module in PACKAGES:
            continue
        here_rank, here = _layer(module)
        for name in imported:
            there_rank, there = _layer(name)
            if (there, here) in ALLOWED_SIDEWAYS or (there_rank > here_rank and (here, there) not in ALLOWED_SIDEWAYS):
                wrong.append(f"{module} imports {name}")
    return wrong


def test_imports_point_down_the_flow():
    wrong = _against_the_flow(_graph())
    assert not wrong, "imports against the flow: " + "; ".join(sorted(wrong))


@pytest.mark.parametrize("module, imported", [
    ("costmodel.inputs.model", "costmodel.terms.moe"),          # a schema reading a formula
    ("costmodel.space.degree_rules", "costmodel.inputs.model"),  # a rule reading a schema
    ("costmodel.terms.block", "costmodel.evaluate"),             # a formula reading evaluation
    ("costmodel.evaluate", "costmodel.measured.runs"),           # evaluation reading measured runs
    ("costmodel.ops", "costmodel.inputs.model"),                 # the base reading a schema
])
def test_an_import_back_up_would_fail(module, imported):
    graph = _graph()
    assert not _against_the_flow(graph)
    assert _against_the_flow({**graph, module: graph[module] | {imported}}) == [f"{module} imports {imported}"]


def test_every_costmodel_module_has_a_layer():
    """No module falls back to the costmodel root's layer but evaluation's own."""
    root = {name for name in _modules() if name.startswith("costmodel") and _layer(name)[1] == "costmodel"}
    assert root == {"costmodel", "costmodel.evaluate", "costmodel.encoding"}


def test_costmodel_readers_import_no_formulas_and_formulas_no_measured_runs():
    """costmodel/ by role: inputs/ (readers) never import terms/ (formulas) or measured/, and
    terms/ never imports measured/ (the runs are scored against the formulas, not the reverse)."""
    forbidden = {"costmodel.inputs": ("costmodel.terms", "costmodel.measured"),
                 "costmodel.terms": ("costmodel.measured",)}
    wrong = [f"{module} imports {name}" for module, imported in _graph().items()
             for group, banned in forbidden.items() if module.startswith(group + ".")
             for name in imported if name.startswith(banned)]
    assert not wrong, "; ".join(sorted(wrong))
    assert {"costmodel.inputs.load", "costmodel.terms.iteration", "costmodel.measured.runs"} <= set(_graph())


def test_no_module_is_too_long():
    long = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert not {n: k for n, k in long.items() if k > MAX_MODULE_LINES}


MAX_FUNCTION_LINES = 80


def test_no_costmodel_function_is_too_long():
    """A formula reads in one screen: no function of costmodel/ over ~80 lines."""
    long = [f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, path in _modules().items() if name.startswith("costmodel")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "; ".join(sorted(long))


def test_every_file_in_a_help_example_exists():
    missing = []
    for name, command in [("mapsat", cli), *cli.commands.items()]:
        help_text = re.sub(r"\\\s*\n\s*", " ", command.help or "")
        for line in help_text.splitlines():
            if "mapsat" not in line:
                continue
            for word in shlex.split(line.strip(), comments=False):
                if "/" in word and word.endswith((".yaml", ".yml", ".json")) and not (ROOT / word).is_file():
                    missing.append(f"{name}: {word}")
    assert not missing, "help examples name missing files: " + ", ".join(missing)


def test_the_lazy_command_list_matches_each_command():
    """`mapsat --help` lists commands from a static table (so it need not import them): each
    entry names the module that holds the command and repeats its first line of help."""
    from solver.cli.app import COMMANDS

    for name, (module, summary) in COMMANDS.items():
        command = cli.commands[name]
        assert command.name == name and command.callback.__module__ == module
        assert command.help.strip().splitlines()[0].strip() == summary
