"""--emit megatron|bridge|torchtitan [--lossy]: the mapping a command chose or read, printed as a
framework's launch text (costmodel.frameworks) instead of the tables."""

from __future__ import annotations

from typing import Callable

import click

from costmodel.frameworks.launch import EMIT_CHOICES, emit
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import System
from solver.search.plan import PlanResult, phase_model

__all__ = ["echo_emitted", "echo_plan_emitted", "emit_options"]


def emit_options(func: Callable) -> Callable:
    """--emit FRAMEWORK and --lossy."""
    func = click.option("--lossy", is_flag=True,
                        help="With --emit: export what the framework can express and list, on comment lines, "
                             "what it cannot (without it such a mapping is refused, exit 1).")(func)
    return click.option("--emit", type=click.Choice(EMIT_CHOICES), default=None,
                        help="Print the mapping as Megatron-LM arguments (a torchrun line), Megatron-Bridge recipe "
                             "overrides or a torchtitan job TOML instead of the tables; a value the framework cannot "
                             "express is refused naming its dimension (docs/frameworks-*.md).")(func)


def echo_emitted(mapping: Mapping, model: Model, system: System, framework: str, lossy: bool) -> None:
    """Print `mapping` as `framework`'s launch text on stdout (what --lossy left out first, as
    comments); a refusal is a MapsatError, one line and exit 1."""
    click.echo(emit(mapping, model, system, framework, lossy).text, nl=False)


def echo_plan_emitted(result: PlanResult, model: Model, system: System, framework: str, lossy: bool) -> None:
    """The chosen count's mapping of each phase as `framework`'s launch text, each phase under a
    `# phase NAME` comment line when there are several."""
    chosen = result.choice.plan
    if chosen is None:
        return                           # no count chosen: the command says why, exit 1
    for phase_plan in chosen.phases:
        if len(chosen.phases) > 1:
            click.echo(f"# phase {phase_plan.phase.name} ({phase_plan.phase.seq_size} tokens a sequence)")
        echo_emitted(phase_plan.result.best.mapping, phase_model(model, phase_plan.phase), system, framework, lossy)
