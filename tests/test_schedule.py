"""The pipeline schedule (the `sched` dimension): ZB-H1 against 1F1B (Qi et al. 2024, §3.1),
the `interleaved` spelling of Megatron's schedule, and solve == brute force where ZB-H1 wins."""

import dataclasses
import math
from pathlib import Path

import pytest
from conftest import plain, solve_equals_brute_force

from costmodel.space.choices import PipelineSchedule
from costmodel.evaluate import evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from solver.space.count import count_mappings
from solver.space.declaration import get_space
from solver.space.pins import parse_pins, pinned

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
MODEL = Model(name="m16", hidden=8192, feedforward=32768, seq_size=4096, attn_heads=64, attn_size=128, num_blocks=16)


def _mapping(sched: str, pp: int = 4, il: int = 1, microbatches: int = 8, tp: int = 1) -> Mapping:
    return Mapping(num_procs=tp * pp, tensor_par=tp, pipeline_par=pp, data_par=1, batch_size=microbatches,
                   microbatch_size=1, pipeline_interleaving=il, pipeline_schedule=sched,
                   activation_recompute="none", datatype="bfloat16")


def test_zb_h1_bubble_is_1f1b_bubble_less_twice_the_weight_gradient_passes():
    """1F1B's bubble (p-1)·(F + B + W) becomes (p-1)·(F + B - W); with W about a third of a
    microbatch (GEMM-dominated blocks, no recompute, no TP: F ≈ B ≈ W) it is near a third
    (the paper's figure when T_F = T_B = T_W); the attention core and element-wise work,
    not part of W, keep it above."""
    one_f = evaluate(MODEL, H100, _mapping("1f1b"))
    zb = evaluate(MODEL, H100, _mapping("zb-h1"))
    ratio = zb.time.bubble_s / one_f.time.bubble_s
    assert 1 / 3 < ratio < 0.5
    assert zb.iteration_time_s == pytest.approx(one_f.iteration_time_s - one_f.time.bubble_s
                                                + zb.time.bubble_s, rel=1e-12)
    # everything else is the same, and so is the memory (ZB-H1 keeps 1F1B's peak: Table 1)
    for name in ("forward_s", "backward_s", "dp_comm_s", "optimizer_s", "pp_comm_s"):
        assert getattr(zb.time, name) == getattr(one_f.time, name)
    assert zb.memory == one_f.memory
    assert math.isclose(sum(zb.time.as_dict().values()), zb.iteration_time_s, rel_tol=1e-12)


def test_zb_h1_changes_nothing_when_interleaved_and_interleaved_reads_as_1f1b_with_chunks():
    interleaved = evaluate(MODEL, H100, _mapping("interleaved", il=2))
    zb = evaluate(MODEL, H100, _mapping("zb-h1", il=2))
    assert interleaved.mapping.pipeline_schedule is PipelineSchedule.one_f_one_b
    assert zb.iteration_time_s == interleaved.iteration_time_s
    assert interleaved.mapping.model_dump(mode="json")["pipeline_schedule"] == "interleaved"
    assert Mapping(**interleaved.mapping.model_dump(mode="json")) == interleaved.mapping
    with pytest.raises(ValueError, match=r"pipeline_schedule\(interleaved\) needs pipeline_interleaving > 1"):
        _mapping("interleaved", il=1)


# Without pins, ZeRO-2/3 or interleaving beat ZB-H1 on these small problems; the pins make
# pipelines of 2 or 4 stages without interleaving, where ZB-H1 wins (the search still
# chooses among 1f1b and zb-h1, every microbatch, sharding stage and flag).
NO_INTERLEAVING = (("pp", (2, 4)), ("interleaving", (1,)))
ZB_CASES = [
    ("zb-h1-16-blocks-h100", Model(name="m16", hidden=4096, feedforward=16384, seq_size=2048, attn_heads=32,
                                    attn_size=128, num_blocks=16), H100, 32, 32, Datatype.bfloat16),
    ("zb-h1-tight-hbm-fp8", Model(name="m24", hidden=6144, feedforward=24576, seq_size=2048, attn_heads=48,
                                   attn_size=128, num_blocks=24), H100.with_overrides(hbm_gib=20), 32, 64,
     Datatype.float8),
]


@pytest.mark.parametrize("case", ZB_CASES, ids=[c[0] for c in ZB_CASES])
def test_solve_equals_brute_force_where_zero_bubble_is_offered(case):
    _, model, system, gpus, cap, datatype = case
    space = dataclasses.replace(plain(get_space("full")), pins=NO_INTERLEAVING)   # as before cp_comm and shard
    result, _ = solve_equals_brute_force(model, system, gpus, cap, space, datatype, Kernels(), top_k=3)
    assert result.best.mapping.pipeline_schedule is PipelineSchedule.zb_h1


@pytest.mark.parametrize("pin, dimension, label", [("zero=2", "zero", "2"), ("sched=zb-h1", "sched", "zb-h1"),
                                                   ("zero=3", "zero", "3")])
def test_fix_by_short_label_counts_what_the_breakdown_gives_that_value(pin, dimension, label):
    """`--fix zero=2` / `--fix sched=zb-h1` read the declaration: the pinned space has as many
    mappings as the full count gives that value."""
    model, system = ZB_CASES[0][1], ZB_CASES[0][2]
    full = get_space("full")
    everything = count_mappings(model, system, 32, 32, full)
    fixed = count_mappings(model, system, 32, 32, pinned(full, parse_pins([pin])))
    assert fixed.mappings == everything.by_dimension[dimension][label] > 0
