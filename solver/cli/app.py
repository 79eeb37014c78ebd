"""The `mapsat` command line: parse, load, call the library, format. Nothing else.

Each command lives in its own module beside this one (solver/cli/<command>.py); the options
they share are in solver/cli/options.py. A command's module is imported only when that
command runs, so `mapsat --help` and the light commands start without loading the CP-SAT
solver (OR-Tools brings pandas with it): `COMMANDS` holds each one's module and the one-line
help that `mapsat --help` lists (a test keeps it equal to the command's own).
Errors the user caused (MapsatError) print one line and exit 1; usage errors exit 2 (click);
`mapsat --debug ...` shows the traceback instead. The group catches them around the whole
command (solver.cli.errors), so none raised while a command's options are turned into its
arguments escapes as a traceback.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

import click

COMMANDS: dict[str, tuple[str, str]] = {
    "batch": ("solver.cli.batch", "Solve every problem of a batch file (models × systems × GPU counts × overrides)."),
    "brute": ("solver.cli.brute", "Evaluate every mapping with the exact model and list the fastest."),
    "calibrate": ("solver.cli.calibrate", "Fit a system file's kernel times to measurements, or its whole-step terms to runs."),
    "codesign": ("solver.cli.codesign", "Find the least hardware that reaches a target, with its best mapping and the proof."),
    "count": ("solver.cli.count", "Count the mappings of a model onto N GPUs, in closed form (milliseconds)."),
    "eval": ("solver.cli.eval", "Evaluate one mapping: iteration time, MFU/HFU and memory, with their breakdown."),
    "explain": ("solver.cli.explain", "Explain the best mapping: the certified best time for each value of each dimension."),
    "plan": ("solver.cli.plan", "Plan a whole training run: GPUs, days, GPU-hours, failures and cost."),
    "plot": ("solver.cli.plot", "Draw PNG plots from the results of `mapsat batch` (RESULTS_DIR/results.jsonl)."),
    "shape": ("solver.cli.shape", "List model shapes near a parameter count by the paper's rule, with mapping counts."),
    "solve": ("solver.cli.solve", "Find the fastest mapping under the exact model, certified optimal by CP-SAT."),
    "spaces": ("solver.cli.spaces", "List the named mapping spaces and what each dimension means."),
    "validate": ("solver.cli.validate", "Compare the model with measurements: Megatron-LM on Selene, or a file of training runs."),
}


class LazyCommands(MutableMapping):
    """The group's commands by name, each module imported on first use (click's lazy-loading
    pattern); commands added later (`cli.add_command`) are kept as given."""

    def __init__(self, lazy: dict[str, str]):
        self._lazy = dict(lazy)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            if name not in self._lazy:
                raise KeyError(name)
            self._loaded[name] = importlib.import_module(self._lazy[name]).command
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._loaded and name not in self._lazy:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._lazy.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._lazy) | set(self._loaded)))

    def __len__(self) -> int:
        return len(set(self._lazy) | set(self._loaded))


class LazyGroup(click.Group):
    """A group listing its commands' one-line help without importing them, and running each
    inside the one-line error handling."""

    def invoke(self, ctx: click.Context):
        from solver.cli.errors import one_line_errors   # imports costmodel: not for `mapsat --help`

        with one_line_errors(ctx):
            return super().invoke(ctx)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1] if name in COMMANDS else self.commands[name].get_short_help_str(limit=80))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show a traceback on errors instead of one line.")
@click.version_option(package_name="mapsat")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Find the fastest way to train a transformer on a GPU cluster.

    \b
    Example:
      mapsat solve --model problems/models/gpt-1t-256b.yaml \\
                   --system problems/systems/h100-80g-nvl8.yaml --gpus 4096 \\
                   --datatype float8 --offload-gib 1024 --offload-gbps 100
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


cli.commands = LazyCommands({name: module for name, (module, _) in COMMANDS.items()})


def main() -> None:
    cli(obj={})
