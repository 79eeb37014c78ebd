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

# Layers in the order data flows; a module may import its own layer and the ones before it.
LAYERS = ("costmodel", "solver.space", "solver.search", "solver.study", "solver.report", "solver.cli")
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


def _layer(module: str) -> str:
    return max((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), key=len)


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


def test_imports_point_down_the_flow():
    wrong = []
    for module, imported in _graph().items():
        if module in PACKAGES:
            continue
        here = _layer(module)
        for name in imported:
            there = _layer(name)
            if LAYERS.index(there) > LAYERS.index(here) and (here, there) not in ALLOWED_SIDEWAYS:
                wrong.append(f"{module} imports {name}")
            if (there, here) in ALLOWED_SIDEWAYS:
                wrong.append(f"{module} imports {name}")
    assert not wrong, "imports against the flow: " + "; ".join(sorted(wrong))


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
