"""mapsat eval: time and memory of one mapping, term by term."""

from __future__ import annotations

import click

from costmodel.errors import MapsatError
from costmodel.evaluate import evaluate
from costmodel.frameworks.launch import load_launch_mapping
from costmodel.inputs.load import load_mapping
from costmodel.terms.param_counts import ParameterCounts
from solver.cli.options import (
    given_once,
    load_problem,
    problem_options,
    system_label,
    user_errors,
)
from solver.cli.emit import echo_emitted, emit_options
from solver.report.documents import dumps
from solver.report.bands import band_json, band_line
from solver.report.tables import console, evaluation_tables


@click.command("eval")
@problem_options
@click.option("--mapping", "mapping_path", required=True, multiple=True, callback=given_once,
              type=click.Path(dir_okay=False),
              help="Mapping file (Calculon execution JSON field names), or a framework's launch file: Megatron-LM "
                   "arguments (a torchrun line or an argument file), Megatron-Bridge overrides "
                   "(section.field=value lines) or a torchtitan job TOML, scored as configured.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of tables.")
@emit_options
@user_errors
def command(model_path, system_path, seq_size, hbm_gib, offload_gib, offload_gbps, nvlink_size, mapping_path, as_json,
            emit, lossy):
    """Evaluate one mapping: iteration time, MFU/HFU and memory, with their breakdown.

    Exits 1 when the mapping does not fit (memory, or a network it does not span), after the
    breakdown (tables, or the whole --json document on stdout), with the reason on one line
    on stderr.

    \b
    Example:
      mapsat eval --model problems/models/gpt3-175b.yaml \\
                  --system problems/systems/a100-80g-selene.yaml \\
                  --mapping problems/mappings/gpt3-175b-seqsel.json
      mapsat eval --model problems/models/llama-3.1-70b/config.json --seq-size 8192 \\
                  --system problems/systems/h100-80g-nvl8.yaml \\
                  --mapping tests/data/frameworks/llama70b-megatron.sh --emit torchtitan --lossy
    """
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    mapping = load_launch_mapping(mapping_path, model, system) or load_mapping(mapping_path)
    if emit:
        echo_emitted(mapping, model, system, emit, lossy)
        return
    ev = evaluate(model, system, mapping)
    counts = ParameterCounts.of(model)
    if as_json:
        click.echo(dumps({**ev.to_dict(), "parameters": counts.to_dict(),
                          "error_band": band_json(model, system, ev.mapping, ev.iteration_time_s)}))
    else:
        out = console()
        label = system_label(system, hbm_gib, offload_gib, offload_gbps, nvlink_size)
        for table in evaluation_tables(ev, title=f"{model.name} ({counts.summary()}) on {ev.mapping.num_procs} x {label}",
                                       band=band_line(model, system, ev.mapping, ev.iteration_time_s)):
            out.print(table)
    if not ev.feasible:
        raise MapsatError(f"{mapping_path}: the mapping does not fit: {'; '.join(ev.reasons)}")
