"""A mapping the tool prints evaluates, read back from its file, to the time it printed.

Two levels: every value of every dimension of the `full` space (rows picked from the
enumeration so that each (dimension, value) pair appears), turned into the Mapping the
search prints and read back through a file, scores what the vectorised model scored, under
the default settings and under every setting of the problem a file states (CUDA graphs,
pipeline send overlap, the MoE dispatcher, the loss, a precision recipe); and the JSON of
`solve`, `brute`, `explain` and `plan`, each mapping written to a file and given to `eval`,
gives the printed iteration time, to 1e-9."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from conftest import H100_SYSTEM
from costmodel.encoding import NAMES, MappingArrays
from costmodel.evaluate import evaluate, evaluate_arrays
from costmodel.inputs.load import load_mapping, load_model, load_system
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from solver.space.declaration import get_space
from solver.space.enumerate import iter_chunks

MOE = {"name": "moe6", "hidden": 64, "feedforward": 256, "seq_size": 64, "attn_heads": 4, "attn_size": 16,
       "num_blocks": 6, "vocab_size": 1000, "num_experts": 4, "experts_per_token": 2, "expert_feedforward": 128}
OFFLOAD = {"offload_gib": 64, "offload_gbps": 50}

SETTINGS = {
    "defaults": Kernels(),
    "every-problem-setting": Kernels(fused_attention=False, grad_datatype="16bit", capacity_factor=1.25,
                                     cuda_graphs="per-layer", pp_comm_overlap=True, moe_dispatcher="flex",
                                     moe_comm_overlap=True, moe_dispatcher_sm_share=0.2, fused_cross_entropy=False),
    "fp8-recipe": Kernels(precision="fp8-tensorwise", optimizer_state="bf16", low_precision_param_gather=True,
                          bf16_first_last_blocks=1, cuda_graphs="full-iteration"),
}


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    directory = tmp_path_factory.mktemp("printed")
    (directory / "moe.yaml").write_text(yaml.safe_dump(MOE))
    model = load_model(directory / "moe.yaml")
    system = load_system(H100_SYSTEM).with_overrides(**OFFLOAD)
    return model, system, directory


def rows_covering_every_value(model, system, num_gpus: int, max_batch: int) -> MappingArrays:
    """The first enumerated row of each (dimension, value) pair of the full space."""
    seen, picks = set(), []
    for _, rows in iter_chunks(model, system, num_gpus, max_batch, get_space("full")):
        for name in NAMES:
            values, first = np.unique(rows.columns[name], return_index=True)
            for value, index in zip(values, first):
                if (name, value) not in seen:
                    seen.add((name, value))
                    picks.append(rows.take(np.array([index])))
    return MappingArrays.concatenate(picks)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_value_of_every_dimension_reads_back_to_the_time_scored(problem, setting):
    model, system, directory = problem
    kernels = SETTINGS[setting]
    rows = rows_covering_every_value(model, system, 4, 4)
    for name in ("ep", "etp", "cp", "pp", "zero", "shard", "weight_offload", "sched", "interleaving"):
        assert len(np.unique(rows.columns[name])) > 1, name      # the cover reaches past the defaults
    scored = evaluate_arrays(model, system, rows, Datatype.bfloat16, kernels).iteration_time_s
    path = directory / "mapping.json"
    for i in range(len(rows)):
        printed = rows.to_mapping(i, Datatype.bfloat16, kernels)
        path.write_text(json.dumps(printed.model_dump(mode="json")))
        read = load_mapping(path)
        assert read.kernels == kernels
        assert evaluate(model, system, read).iteration_time_s == pytest.approx(float(scored[i]), rel=1e-9, abs=0)


# ---- the commands' JSON, through `eval`

PROBLEM_SETTINGS = ["--cuda-graphs", "per-layer", "--pp-comm-overlap", "--capacity-factor", "1.25",
                    "--attention", "unfused"]


def mapsat(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="mapsat")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def printed_mappings(command: str, document: dict) -> list[tuple[dict, float]]:
    """(mapping, printed iteration time) of every mapping a command's JSON holds."""
    if command == "solve":
        return [(row["mapping"], row["iteration_time_s"]) for row in [document["best"], *document["top"]]]
    if command == "brute":
        return [(row["mapping"], row["iteration_time_s"]) for row in document["top"]]
    if command == "explain":
        rows = [document["winner"], *document["rows"]]
        return [(row["mapping"], row["iteration_time_s"]) for row in rows if row and row["mapping"]]
    return [(phase["mapping"], phase["iteration_time_s"]) for row in document["counts"] for phase in row["phases"]]


@pytest.mark.parametrize("command", ["solve", "brute", "explain", "plan"])
def test_every_mapping_a_command_prints_evaluates_to_the_printed_time(problem, command):
    model, system, directory = problem
    base = ["--model", directory / "moe.yaml", "--system", H100_SYSTEM, "--offload-gib", 64, "--offload-gbps", 50,
            "--max-batch", 8, *PROBLEM_SETTINGS]
    extra = {"solve": ["--gpus", 4, "--top-k", 3], "brute": ["--gpus", 4, "--top-k", 3, "--workers", 1],
             "explain": ["--gpus", 4, "--dims", "pp,zero"], "plan": ["--gpus", "4,8", "--tokens", 1e9]}[command]
    printed = printed_mappings(command, mapsat(command, *base, *extra, "--json"))
    assert printed
    path = directory / f"{command}.json"
    for mapping, time_s in printed:
        assert mapping["pipeline_comm_overlap"] is True and mapping["cuda_graphs"] == "per-layer"
        path.write_text(json.dumps(mapping))
        evaluated = mapsat("eval", "--model", directory / "moe.yaml", "--system", H100_SYSTEM,
                           "--offload-gib", 64, "--offload-gbps", 50, "--mapping", path, "--json")
        assert evaluated["iteration_time_s"] == pytest.approx(time_s, rel=1e-9, abs=0), mapping
