"""Fixed dimensions (--fix) and a fixed global batch (--batch, --batch-tokens): the pinned
space is exactly the mappings of the unpinned one that take the pinned values, counted the
same way in closed form, by enumeration and by CP-SAT; a pinned solve equals brute force on
the same pins, certified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from ortools.sat.python import cp_model

from conftest import cp_sat_solution_count, plain, solve_equals_brute_force
from costmodel.space.dimensions import BY_NAME
from costmodel.errors import InputError
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from solver.search.cpsat.constraints import STRUCTURE, Problem
from solver.search.cpsat.variables import Variables
from solver.search.solve import SolverConfig, solve
from solver.space.count import count_mappings
from solver.space.declaration import get_space, skeletons
from solver.space.enumerate import enumerate_all
from solver.space.pins import batch_cap, parse_pins, pinned

ROOT = Path(__file__).resolve().parents[1]
A100 = load_system(ROOT / "problems/systems/a100-80g-selene.yaml")
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
SMALL = Model(name="small", hidden=1024, feedforward=4096, seq_size=1024, attn_heads=16, attn_size=64, num_blocks=8)


def test_parse_pins_reads_names_labels_fields_and_values():
    pins = parse_pins(["tensor_par=2,4", "recompute=full,none", "w-off=on", "dp_net=1", "mb=1"])
    assert pins == (("tp", (2, 4)), ("microbatch", (1,)), ("recompute", (0, 2)), ("weight_offload", (1,)),
                    ("dp_net", (1,)))


@pytest.mark.parametrize("text, message", [
    ("tpp=2", "'tpp' is not a dimension (did you mean tp?)"),
    ("recompute=most", "'most' is not a recompute (choose from full, attn_only, none)"),
    ("tp=0", "'0' is not a whole number >= 1"),
    ("weight_offload=maybe", "'maybe' is not on or off"),
    ("tp", "write DIM=VALUE"),
])
def test_bad_pins_name_what_is_wrong(text, message):
    with pytest.raises(InputError) as raised:
        parse_pins([text])
    assert message in str(raised.value)


def test_a_dimension_fixed_twice_is_an_error():
    with pytest.raises(InputError, match="tp is fixed twice"):
        parse_pins(["tp=2", "tensor_par=4"])


def test_fixed_batch_and_tokens():
    assert batch_cap(3072, 1024, None, 2048, False) == (1024, (("batch", (1024,)),))
    assert batch_cap(3072, None, 16 * 2**20, 8192, False) == (2048, (("batch", (2048,)),))
    with pytest.raises(InputError, match="not a whole number of sequences"):
        batch_cap(3072, None, 1000, 2048, False)
    with pytest.raises(InputError, match="give one"):
        batch_cap(64, 32, None, 2048, True)


PIN_SETS = [
    pytest.param(["tp=2"], marks=pytest.mark.slow),                         # ~73,000 mappings for CP-SAT
    pytest.param(["recompute=full,none", "pp=2"], marks=pytest.mark.slow),  # to list: ~2.5 s each
    ["tp_overlap=ring"],              # tp 1 pins it to none: those splits drop out
    ["weight_offload=on", "microbatch=1"],
    ["dp_net=1", "interleaving=2"],
    ["zero=1", "tp_comm=rs_ag", "seq_par_ag_redo=on"],
    ["batch=8", "zero=2", "sched=zb-h1"],
]


@pytest.mark.parametrize("fix", PIN_SETS, ids=lambda fix: "+".join(fix))
def test_pinned_count_equals_filtered_enumeration_and_cp_sat(fix):
    system = A100.with_overrides(offload_gib=64, offload_gbps=50)
    space = plain(get_space("full"))     # as before cp_comm and shard (their --fix: their own tests)
    gpus, cap = 4, 8
    pins = parse_pins(fix)
    fixed = pinned(space, pins)
    everything = enumerate_all(SMALL, system, gpus, cap, space)
    keep = np.ones(len(everything), dtype=bool)
    for name, allowed in pins:
        keep &= np.isin(everything.columns[name].astype(np.int64), allowed)
    counted = count_mappings(SMALL, system, gpus, cap, fixed)
    assert counted.mappings == int(keep.sum()) == len(enumerate_all(SMALL, system, gpus, cap, fixed)) > 0
    m = cp_model.CpModel()
    v = Variables(m, fixed, skeletons(SMALL, gpus, cap, fixed), gpus, len(system.networks))
    for constraint in STRUCTURE:
        constraint.add(m, v, Problem(SMALL, system, gpus, cap, fixed))
    assert cp_sat_solution_count(m) == counted.mappings


SOLVE_CASES = [
    ("tp-fixed", A100, 16, 64, Datatype.float16, ["tp=4"]),
    ("flags-not-searched", H100, 16, 128, Datatype.float8, ["tp_overlap=none", "dp_overlap=off", "tp_net=0"]),
    ("recompute-and-offload", A100.with_overrides(offload_gib=256, offload_gbps=50), 16, 64, Datatype.bfloat16,
     ["recompute=full", "optimizer_offload=on"]),
    ("batch-fixed", H100, 32, 96, Datatype.float8, ["batch=96", "pp=2,4"]),
]


@pytest.mark.parametrize("case", SOLVE_CASES, ids=[c[0] for c in SOLVE_CASES])
def test_pinned_solve_equals_brute_force_on_the_same_pins(case):
    _, system, gpus, cap, datatype, fix = case
    model = Model(name="m", hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128,
                  num_blocks=16)
    space = pinned(plain(get_space("full")), parse_pins(fix))     # as before cp_comm and shard, as below
    result, _ = solve_equals_brute_force(model, system, gpus, cap, space, datatype, Kernels(), top_k=2)
    values = result.best.mapping.values()
    for name, allowed in space.pins:
        dim = BY_NAME[name]
        assert (dim.code_of(values[name]) if dim.is_flag else values[name]) in allowed
    unpinned = solve(model, system, gpus, max_batch=cap, datatype=datatype, space=plain(get_space("full")),
                     config=SolverConfig(top_k=1, time_limit_s=120))
    assert unpinned.best.iteration_time_s <= result.best.iteration_time_s * (1 + 1e-12)


def _cli(*args):
    return CliRunner().invoke(cli, ["count", "--model", "problems/models/gpt3-175b.yaml",
                                    "--system", "problems/systems/h100-80g-nvl8.yaml", "--gpus", "512", *args])


def test_cli_fix_and_fixed_batch():
    whole = json.loads(_cli("--json").output)
    tp8 = json.loads(_cli("--json", "--fix", "tp=8").output)
    assert tp8["mappings"] == whole["by_dimension"]["tp"]["8"] > 0
    assert tp8["by_dimension"]["tp"] == {"8": tp8["mappings"]}
    fixed = json.loads(_cli("--json", "--batch", "1024").output)
    assert set(fixed["by_dimension"]["batch"]) == {"1024"}
    tokens = json.loads(_cli("--json", "--batch-tokens", str(1024 * 2048)).output)
    assert tokens["mappings"] == fixed["mappings"]


@pytest.mark.parametrize("args, message", [
    (("--fix", "tpp=2"), "did you mean tp?"),
    (("--batch", "1024", "--max-batch", "2048"), "give one"),
    (("--batch-tokens", "1000"), "not a whole number of sequences"),
])
def test_cli_bad_fix_is_one_line(args, message):
    result = _cli(*args)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
