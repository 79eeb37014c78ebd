"""mapsat codesign: the least hardware (over a grid of knob values) that reaches a target."""

from __future__ import annotations

import math

import click
from rich.table import Table

from costmodel.errors import InputError, MapsatError
from costmodel.inputs.system import Datatype
from solver.cli.options import (progress_line, batch_header, headroom_text, datatype_option, load_problem, problem_options, space_and_cap, space_options,
                                user_errors, wide_console)
from solver.report.figure import image_path
from solver.report.documents import dumps
from solver.report.tables import mapping_summary, mfu_text
from solver.search.codesign import KNOBS, CodesignResult, Grid, Target, codesign
from solver.search.solve import SolverConfig


def parse_vary(texts: tuple[str, ...]) -> dict[str, tuple[float, ...]]:
    """`KNOB=V,V,...` (repeatable) -> {knob: values}, in the order given."""
    out: dict[str, tuple[float, ...]] = {}
    for text in texts:
        knob, sep, values = text.partition("=")
        knob = knob.strip()
        if not sep or not values.strip():
            raise InputError(f"--vary {text}: write KNOB=V,V,... (knobs: {', '.join(KNOBS)})")
        if knob in out:
            raise InputError(f"--vary {text}: {knob} is varied twice")
        try:
            out[knob] = tuple(float(v) for v in values.split(","))
        except ValueError:
            raise InputError(f"--vary {text}: the values must be numbers") from None
    return out


def grid_offload_gib(offload_gib: float | None, offload_gbps: float | None,
                     varied: dict[str, tuple[float, ...]]) -> float | None:
    """The offload capacity the base system takes: --offload-gib, or with --offload-gbps alone
    while the grid varies offload_gib, the grid's largest capacity (each point resizes it; 0
    removes it), so --offload-gbps gives the bandwidth of every offload tier the grid adds."""
    capacities = [v for v in varied.get("offload_gib", ()) if v > 0]
    if offload_gib is None and offload_gbps is not None and capacities:
        return max(capacities)
    return offload_gib


def parse_cost(text: str | None) -> dict[str, float]:
    """`KNOB=W,KNOB=W` -> {knob: weight}."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        knob, sep, weight = part.partition("=")
        try:
            out[knob.strip()] = float(weight) if sep else math.nan
        except ValueError:
            out[knob.strip()] = math.nan
        if not math.isfinite(out[knob.strip()]):
            raise InputError(f"--cost {part}: write KNOB=WEIGHT with a number >= 0")
    return out


def parse_target(target_mfu: float | None, target_time: float | None, within: str | None) -> Target:
    given = [(name, v) for name, v in (("--target-mfu", target_mfu), ("--target-time", target_time),
                                       ("--within", within)) if v is not None]
    if len(given) != 1:
        names = ", ".join(f"{n} {v}" for n, v in given) or "none"
        raise InputError(f"give exactly one of --target-mfu, --target-time, --within (given: {names})")
    if within is not None:
        text = within.strip()
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise InputError(f"--within: {within!r} is not a fraction (0.05) or a percentage (5%)") from None
        return Target("within", value)
    return Target("mfu", target_mfu) if target_mfu is not None else Target("time", target_time)


@click.command("codesign")
@problem_options
@space_options
@datatype_option
@click.option("--target-mfu", type=float, default=None, help="Reach this MFU (a fraction, e.g. 0.70).")
@click.option("--target-time", type=float, default=None, help="Reach this iteration time, s.")
@click.option("--within", default=None, metavar="F",
              help="Reach MFU >= (1 - F) x the best the grid allows (time <= best / (1 - F)); 0.05 or 5%.")
@click.option("--vary", multiple=True, required=True, metavar="KNOB=V,V,...",
              help=f"A knob and its ascending candidate values (repeatable; knobs: {', '.join(KNOBS)}).")
@click.option("--minimize", default="", metavar="KNOB[,KNOB...]",
              help="Least means lexicographically least in this order; the other varied knobs follow in "
                   "--vary order.")
@click.option("--cost", "cost_text", default=None, metavar="KNOB=W[,...]",
              help="Least means the smallest sum of weight x value (ties: the lexicographic order).")
@click.option("--time-limit", "time_limit_s", type=click.FloatRange(min=0, min_open=True), default=120.0,
              show_default=True, help="Wall-clock limit per candidate system asked, s.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="CP-SAT search workers.")
@click.option("--pareto", "pareto_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw the MFU of every system asked against each varied knob into this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of tables.")
@user_errors
def command(model_path, system_path, seq_size, hbm_gib, offload_gib, offload_gbps, nvlink_size, num_gpus, max_batch,
            batch, batch_tokens, space_name, fix, kernels, datatype, target_mfu, target_time, within, vary,
            minimize, cost_text, time_limit_s, workers, pareto_path, as_json):
    """Find the least hardware that reaches a target, with its best mapping and the proof.

    Over the grid of --vary values, the least system (by --minimize or --cost) whose
    certified best mapping reaches the target, and for every smaller system a proof that
    it misses: infeasible, or a certified best time slower than the target. More HBM,
    offload capacity or offload bandwidth never makes a mapping slower, so a larger system
    that misses proves every smaller one; capacities share one CP-SAT model (each an
    assumption); NVLink sizes are enumerated (docs/codesign.md).

    \b
    Example:
      mapsat codesign --model problems/models/gpt3-175b.yaml \\
                      --system problems/systems/h100-80g-nvl8.yaml --gpus 1024 \\
                      --within 2% --vary hbm_gib=16,24,32,48 --vary offload_gib=0,256 \\
                      --minimize hbm_gib,offload_gib
    """
    target = parse_target(target_mfu, target_time, within)
    if pareto_path is not None:              # before the search: a path it could not write is refused now
        pareto_path = image_path(pareto_path, "--pareto")
    varied = parse_vary(vary)
    model, system = load_problem(model_path, system_path, hbm_gib,
                                 grid_offload_gib(offload_gib, offload_gbps, varied), offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    knobs = tuple(k.strip() for k in minimize.split(",") if k.strip())
    grid = Grid.build(varied, knobs, parse_cost(cost_text))
    space, max_batch = space_and_cap(space_name, fix, max_batch, batch, batch_tokens, model, system,
                                     num_gpus)
    with progress_line() as say:
        say(f"codesign: a grid of {math.prod(len(v) for v in grid.values.values()):,} systems")
        result = codesign(model, system, num_gpus, grid, target, max_batch=max_batch, datatype=Datatype(datatype),
                          space=space, kernels=kernels, config=SolverConfig(time_limit_s=time_limit_s, workers=workers),
                          pareto=pareto_path is not None)
    headroom = f" ({headroom_text(system)})" if headroom_text(system) else ""
    title = (f"{model.name} on {num_gpus:,} x {system.name}{headroom}, {datatype}, "
             f"{batch_header(space, max_batch, model)}, {kernels.label}")
    if pareto_path is not None:
        from solver.report.codesign_plot import plot_pareto

        plot_pareto(result, grid, pareto_path, title)
    if as_json:
        click.echo(dumps(result.to_dict()))
    else:
        print_result(result, title)
    if result.system is None:
        raise MapsatError("no system of the grid reaches the target (each is proven to miss it)")


def _point(system: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in system.items())


def print_result(result: CodesignResult, title: str) -> None:
    console = wide_console()
    proven = "certified" if result.certified_optimal else "NOT certified (time limit)"
    target = f"{result.target_time_s:.4f} s" if result.target_time_s is not None else "none (nothing feasible)"
    console.print(f"{title}: target {target}; {result.questions} of {result.grid_size} systems asked, "
                  f"{proven}, {result.seconds:.1f} s")
    if result.system is not None:
        best = result.best
        console.print(f"  least system: {_point(result.system)}")
        console.print(f"  best: {best.iteration_time_s:.4f} s, {mfu_text(best)}: "
                      f"{mapping_summary(best.mapping.model_dump(mode='json'))}")
    if not result.proof:
        console.print("  proof: no smaller system on the grid")
        return
    table = Table(title="Proof: every smaller system misses the target", title_justify="left")
    for header in ("system", "verdict", "best s", "by"):
        table.add_column(header)
    for v in result.proof:
        verdict = "infeasible" if v.best_time_s is None else "slower"
        time_text = "" if v.best_time_s is None else (f"{v.best_time_s:.4f}" if v.dominated_by is None
                                                      else f">= {v.best_time_s:.4f}")
        table.add_row(_point(v.system), verdict + ("" if v.certified else " (not certified)"), time_text,
                      "asked" if v.dominated_by is None else _point(v.dominated_by))
    console.print(table)
