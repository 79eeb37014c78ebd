"""`mapsat explain`: the certified best per value of each dimension equals brute force over
the space with that value fixed (same time to 1e-9, same mapping), for every dimension and
value, on small problems; the runner-up is the fastest strictly slower alternative."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import cases
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from solver.search.brute import scan
from solver.search.explain import explain
from solver.space.declaration import get_space
from solver.space.pins import pinned

ROOT = Path(__file__).resolve().parents[1]
A100 = load_system(ROOT / "problems/systems/a100-80g-selene.yaml")
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
MODEL = Model(name="m", hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=16)
GQA = Model(name="gqa", hidden=2048, feedforward=5632, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=8,
            kv_heads=4, mlp="swiglu", norm="rmsnorm", position="rope", bias=False, tied_embeddings=False)

CASES = [
    ("a100-offload", MODEL, A100.with_overrides(offload_gib=128, offload_gbps=50), 16, 64, Datatype.bfloat16, "full",
     "fused"),
    ("h100-fp8-calculon", MODEL, H100, 32, 128, Datatype.float8, "calculon-2023", "unfused"),
    ("gqa-swiglu", GQA, H100, 16, 64, Datatype.bfloat16, "full", "fused"),
    ("gqa-swiglu-4gpu", GQA, H100, 4, 32, Datatype.bfloat16, "full", "fused"),
]


@pytest.mark.parametrize("case", cases(CASES, slow={
    # the reference is a brute-force scan of the space for every value of every dimension
    "a100-offload": "~110 s: `full` with offload, 16 GPUs", "gqa-swiglu": "~10 s: 16 GPUs (4 in the default run)"}))
def test_every_value_equals_brute_force_with_that_value_fixed(case):
    _, model, system, gpus, cap, datatype, space_name, attention = case
    space, kernels = get_space(space_name), Kernels.with_attention(attention)
    result = explain(model, system, gpus, max_batch=cap, datatype=datatype, space=space, kernels=kernels)
    assert result.certified and result.rows
    for row in result.rows:
        reference = scan(model, system, gpus, cap, pinned(space, ((row.dimension, (row.value,)),)), datatype,
                         kernels, top_k=1, workers=1)
        if reference.best is None:
            assert row.best is None, (row.dimension, row.label)
            continue
        assert math.isclose(row.best.iteration_time_s, reference.best.iteration_time_s, rel_tol=1e-9), row.label
        assert row.best.mapping == reference.best.mapping, (row.dimension, row.label)
    overall = scan(model, system, gpus, cap, space, datatype, kernels, top_k=1, workers=1)
    assert result.winner.mapping == overall.best.mapping
    slower = [r.best.iteration_time_s for r in result.rows
              if r.best is not None and r.best.iteration_time_s > result.winner.iteration_time_s * (1 + 1e-9)]
    assert result.runner_up.best.iteration_time_s == min(slower)


def test_cli_explain_json_and_dims():
    args = ["explain", "--model", "problems/models/gpt3-13b.yaml", "--system", "problems/systems/a100-80g-selene.yaml",
            "--gpus", "16", "--max-batch", "64", "--dims", "tp,recompute", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert {row["dimension"] for row in document["rows"]} == {"tp", "recompute"}
    assert document["certified"] and document["winner"]["mfu"] > 0
    bad = CliRunner().invoke(cli, args[:-3] + ["--dims", "tpp"])
    assert bad.exit_code == 1 and "tpp is not a dimension" in bad.output
