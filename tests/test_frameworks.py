"""The mapping as Megatron-LM arguments, Megatron-Bridge overrides and a torchtitan job TOML, and
back: what is printed is what each framework's own definitions (cited tables at pinned commits)
accept, the published Bridge rows survive import → export → import, and what a framework cannot
run is refused naming the dimension."""

from __future__ import annotations

import functools
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodel.errors import InputError
from costmodel.frameworks.bridge import export_bridge, import_bridge, parse_overrides
from costmodel.frameworks.definitions import BRIDGE, MEGATRON, TORCHTITAN, check_field, definitions, megatron_parser
from costmodel.frameworks.megatron import import_megatron
from costmodel.frameworks.torchtitan import export_torchtitan, import_torchtitan
from costmodel.evaluate import evaluate
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.measured.run_bridge import load_workload_settings
from costmodel.measured.run_files import read_runs
from costmodel.measured.run_mapping import map_run
from costmodel.measured.run_scoring import RunInputs
from solver.cli.app import cli

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "frameworks"
MODEL = str(ROOT / "problems/models/llama-3.1-70b/config.json")
SYSTEM = str(ROOT / "problems/systems/h100-80g-nvl8.yaml")
SOLVE = ["solve", "--model", MODEL, "--seq-size", "8192", "--system", SYSTEM, "--gpus", "64",
         "--precision", "fp8-tensorwise"]
# The best mapping unpinned keeps the sequence-parallel all-gather's output (seq_par_ag_redo off) and
# shards ZeRO-3 in groups of 8 under PyTorch FSDP2, which Megatron-LM cannot run (test below); these
# pins leave the mappings it can.
MEGATRON_PINS = ["--fix", "seq_par_ag_redo=on", "--fix", "shard=all"]
TORCHTITAN_PINS = ["--fix", "recompute=full,none", "--fix", "zero=3", "--fix", "shard=all", "--fix",
                   "seq_par_ag_redo=off", "--fix", "sched=1f1b"]


@pytest.fixture(scope="module")
def llama():
    return load_model(MODEL, seq_size=8192), load_system(SYSTEM)


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


def _best(pins: list[str]) -> Mapping:
    return _best_of(tuple(pins))


@functools.cache
def _best_of(pins: tuple[str, ...]) -> Mapping:
    code, out = _invoke([*SOLVE, *pins, "--json", "--top-k", "1"])
    assert code == 0, out
    return Mapping.model_validate(json.loads(out)["best"]["mapping"])


@pytest.mark.parametrize("framework", [MEGATRON, BRIDGE, TORCHTITAN])
def test_definition_tables_cite_a_pinned_commit_and_a_line_for_every_entry(framework):
    table = definitions(framework)
    assert re.fullmatch(r"[0-9a-f]{40}", table.commit)
    for name, spec in {**table.used, **table.ignored}.items():
        assert re.search(r"\.py:\d+", spec["source"]), name


def test_solve_emit_megatron_prints_arguments_megatrons_parser_accepts(llama):
    code, out = _invoke([*SOLVE, *MEGATRON_PINS, "--emit", "megatron"])
    assert code == 0, out
    tokens = shlex.split(out.replace("\\\n", " "))
    assert tokens[:5] == ["torchrun", "--nnodes", "8", "--nproc-per-node", "8"]
    args, unknown = megatron_parser().parse_known_args(tokens[tokens.index("pretrain_gpt.py") + 1:])
    assert unknown == []
    best = _best(MEGATRON_PINS)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.global_batch_size,
            args.micro_batch_size, args.seq_length) == (best.tensor_par, best.pipeline_par, best.batch_size,
                                                         best.microbatch_size, 8192)
    assert args.fp8_recipe == "tensorwise" and args.bf16
    # read back, the arguments cost what the solver certified
    model, system = llama
    imported = import_megatron(out, model, system, "emitted")
    assert evaluate(model, system, imported).iteration_time_s == pytest.approx(
        evaluate(model, system, best).iteration_time_s, rel=1e-9)


def test_solve_emit_bridge_prints_declared_fields_of_declared_types(llama):
    code, out = _invoke([*SOLVE, *MEGATRON_PINS, "--emit", "bridge"])
    assert code == 0, out
    overrides = parse_overrides(out, "emitted")        # each checked against the cited types
    assert all(check_field(BRIDGE, name, value, "emitted") for name, value in overrides.items())
    assert overrides["mixed_precision.fp8_recipe"] == "tensorwise"
    assert overrides["model.tensor_model_parallel_size"] * overrides["comm_overlap.data_parallel_size"] == 64
    model, system = llama
    best = _best(MEGATRON_PINS)
    assert evaluate(model, system, import_bridge(out, model, system, "emitted")).iteration_time_s == pytest.approx(
        evaluate(model, system, best).iteration_time_s, rel=1e-9)


def test_solve_emit_torchtitan_prints_jobconfig_fields(llama):
    code, out = _invoke([*SOLVE, *TORCHTITAN_PINS, "--emit", "torchtitan"])
    assert code == 0, out
    job = tomllib.loads(out)
    flat = {f"{section}.{key}": value for section, keys in job.items() for key, value in keys.items()
            if not isinstance(value, dict)}
    flat.update({f"quantize.linear.float8.{k}": v for k, v in job["quantize"]["linear"]["float8"].items()})
    assert all(check_field(TORCHTITAN, name, value, "emitted") for name, value in flat.items())
    parallel = job["parallelism"]
    assert (parallel["tensor_parallel_degree"] * parallel["data_parallel_shard_degree"]
            * parallel["data_parallel_replicate_degree"] * parallel.get("pipeline_parallel_degree", 1)) == 64
    model, system = llama
    best = _best(TORCHTITAN_PINS)
    # the same mapping, with the FP8 weight all-gather stated where the solver left it to the recipe
    stated = Mapping.model_validate({**best.model_dump(mode="json"), "low_precision_param_gather": True})
    assert best.low_precision_param_gather is None
    assert import_torchtitan(out, model, system, "emitted") == stated


def test_megatron_refuses_what_it_cannot_run_naming_the_dimension_unless_lossy():
    code, out = _invoke([*SOLVE, "--emit", "megatron"])
    assert code == 1
    assert re.search(r"Megatron-LM cannot express .*seq_par_ag_redo\(False\)", out) and "Traceback" not in out
    code, out = _invoke([*SOLVE, "--emit", "megatron", "--lossy"])
    assert code == 0 and out.startswith("# not expressed (--lossy): seq_par_ag_redo(False)")


def test_torchtitan_refuses_zero1_naming_the_dimension(llama):
    model, _ = llama
    mapping = Mapping.model_validate({**_best(MEGATRON_PINS).model_dump(mode="json"), "sharding_stage": 1})
    with pytest.raises(InputError, match=r"torchtitan cannot express .*sharding_stage\(1\): torchtitan has no ZeRO-1"):
        export_torchtitan(mapping, model)
    assert "sharding_stage(1)" in export_torchtitan(mapping, model, lossy=True).left_out[0]


def _bridge_rows():
    settings = load_workload_settings()
    return [run for run in read_runs(ROOT / "problems/runs/megatron-bridge-pretraining.json") if run.name in settings]


def test_every_bridge_row_with_workload_settings_survives_import_export_import():
    inputs, rows = RunInputs(), _bridge_rows()
    assert len(rows) == 92
    refused = []
    for run in rows:
        model, system = inputs.model(run), inputs.system(run)
        first = map_run(run, model, system).mapping            # the published row and its recipe's settings
        try:
            text = export_bridge(first, model, system).text
        except InputError as err:                              # a layout the rule cannot give in whole blocks
            assert "pipeline_par(" in str(err) and "no whole layout" in str(err), run.name
            refused.append(run.name)
            continue
        second = import_bridge(text, model, system, run.name)
        assert second == first, run.name
        assert export_bridge(second, model, system).text == text
        assert import_bridge(text, model, system, run.name) == second
    assert refused == ["bridge2511_deepseek_v3_gb200_mxfp8_256_nomtp"]


def test_importers_name_a_field_they_do_not_know(llama):
    model, system = llama
    launch = (DATA / "llama70b-megatron.sh").read_text()
    with pytest.raises(InputError, match="unknown Megatron-LM argument '--no-such-flag'"):
        import_megatron(launch.rstrip() + " \\\n    --no-such-flag\n", model, system, "f.sh")
    with pytest.raises(InputError, match="unknown Megatron-Bridge field 'model.no_such_field'"):
        parse_overrides("model.no_such_field=1\n", "f.txt")
    with pytest.raises(InputError, match="unknown torchtitan field 'parallelism.no_such_degree'"):
        import_torchtitan("[parallelism]\nno_such_degree = 2\n", model, system, "f.toml")


def test_eval_scores_a_launch_file_as_configured(llama):
    code, out = _invoke(["eval", "--model", MODEL, "--seq-size", "8192", "--system", SYSTEM, "--json",
                         "--mapping", str(DATA / "llama70b-megatron.sh")])
    assert code == 0, out
    model, system = llama
    best = _best(MEGATRON_PINS)
    assert json.loads(out)["iteration_time_s"] == pytest.approx(evaluate(model, system, best).iteration_time_s,
                                                                 rel=1e-9)
    code, out = _invoke(["eval", "--model", MODEL, "--seq-size", "4096", "--system", SYSTEM,
                         "--mapping", str(DATA / "llama70b-megatron.sh")])
    assert code == 1 and "sequence length 8192 differs from the model's seq_size 4096" in out


def test_plan_emits_the_chosen_counts_mapping():
    code, out = _invoke(["plan", "--model", MODEL, "--seq-size", "8192", "--system", SYSTEM, "--tokens", "15e12",
                         "--batch-tokens", "16777216", "--gpus", "1024", "--emit", "bridge", "--lossy"])
    assert code == 0, out
    overrides = parse_overrides(out, "emitted")
    degrees = [overrides[f"model.{name}_parallel_size"] for name in ("tensor_model", "pipeline_model", "context")]
    assert degrees[0] * degrees[1] * degrees[2] * overrides["comm_overlap.data_parallel_size"] == 1024
    assert overrides["train.global_batch_size"] * overrides["model.seq_length"] == 16777216


def test_megatron_reads_a_launch_scripts_arguments_or_an_argument_file(llama):
    model, system = llama
    launch = (DATA / "llama70b-megatron.sh").read_text()
    expected = import_megatron(launch, model, system, "launch")
    arguments = launch.split("pretrain_gpt.py", 1)[1]
    script = ("#!/bin/bash\n# a comment\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
              "python -m torch.distributed.run --nproc_per_node 8 --nnodes 8 pretrain_gpt.py" + arguments)
    assert import_megatron(script, model, system, "script") == expected
    assert import_megatron("WORLD_SIZE=64\n" + arguments.replace("\\\n", "\n"), model, system, "file") == expected
    with pytest.raises(InputError, match="the GPU count is not stated"):
        import_megatron(arguments, model, system, "args.txt")
    with pytest.raises(InputError, match=r"'\$TP': a shell variable"):
        import_megatron(launch.replace("--tensor-model-parallel-size 4", "--tensor-model-parallel-size $TP"), model,
                        system, "f.sh")
    with pytest.raises(InputError, match="recomputes block by block"):
        import_megatron(launch + " --recompute-granularity full --recompute-method uniform --recompute-num-layers 5",
                        model, system, "f.sh")
