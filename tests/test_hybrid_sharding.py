"""Hybrid sharding (`shard`, a mapping file's `sharding_group`): ZeRO shards over groups of
`shard` inner GPUs of dp·cp and replicates across them (PyTorch FSDP's HYBRID_SHARD,
Megatron-LM's num_distributed_optimizer_instances). Hand-computed memory and traffic terms,
the count's growth by exactly the new mappings, --fix, and solve = brute force where a
shard group smaller than dp·cp wins."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_block_floors_below_exact, ring_only, solve_equals_brute_force
from test_solve import H100, small_model

from costmodel.evaluate import evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.cli.app import cli
from solver.space.count import count_mappings
from solver.space.declaration import get_space
from solver.space.enumerate import enumerate_all
from solver.space.pins import pinned

NET0_GBPS, NET1_GBPS, EFFICIENCY, LATENCY_S = 100.0, 10.0, 0.8, 1e-6


def two_level_system() -> System:
    """An 8-GPU domain at 100 GB/s and a slower 10 GB/s network over every GPU (no port per GPU)."""
    networks = [dict(name="inner", size=8, bandwidth_gbps=NET0_GBPS, efficiency=EFFICIENCY, latency_us=1.0,
                     processor_usage=0.1),
                dict(name="outer", size=4096, bandwidth_gbps=NET1_GBPS, efficiency=EFFICIENCY, latency_us=1.0,
                     processor_usage=0.1)]
    return System.model_validate(dict(
        name="two-level", compute={"bfloat16": dict(matrix_tflops=100.0, vector_tflops=10.0,
                                                    matrix_efficiency=[[0, 1.0]], vector_efficiency=[[0, 1.0]])},
        hbm=dict(capacity_gib=80, bandwidth_gbps=2000), networks=networks))


MODEL = Model(name="m", hidden=256, feedforward=1024, seq_size=128, attn_heads=4, attn_size=64, num_blocks=2)


def dp16(stage: int, shard: int | None = None) -> Mapping:
    return Mapping(num_procs=16, tensor_par=1, pipeline_par=1, data_par=16, batch_size=16, microbatch_size=1,
                   sharding_stage=stage, sharding_group=shard, data_par_net=1)


def ring(op_factor: float, n: int, message_bytes: float, gbps: float) -> float:
    """One ring collective by hand: latency + B·factor·(n-1)/n / (bandwidth·efficiency)."""
    return LATENCY_S + message_bytes * op_factor * (n - 1) / n / (gbps * 1e9 * EFFICIENCY)


def test_memory_and_traffic_terms_by_hand():
    system = two_level_system()
    replicated = evaluate(MODEL, system, dp16(0))
    # the stage's parameters (pp = 1, tied embeddings: the blocks and the embedding)
    params = MODEL.num_blocks * MODEL.block_params + MODEL.embedding_params
    for stage in (1, 2, 3):
        whole, hybrid = evaluate(MODEL, system, dp16(stage)), evaluate(MODEL, system, dp16(stage, 8))
        # memory: the sharded states divided by the shard group (8) instead of dp·cp (16)
        for term, sharded_from in (("optimizer_bytes", 1), ("weight_grads_bytes", 2), ("weights_bytes", 3)):
            divisor = (8, 16) if stage >= sharded_from else (1, 1)
            assert getattr(hybrid.memory, term) == pytest.approx(getattr(replicated.memory, term) / divisor[0], rel=1e-12)
            assert getattr(whole.memory, term) == pytest.approx(getattr(replicated.memory, term) / divisor[1], rel=1e-12)
    # traffic, stage 1 (one microbatch, no overlap): 2-byte gradients and weights (bf16)
    grads = weights = 2 * params
    # whole group: reduce-scatter and all-gather over 16 on the outer network (8 per domain,
    # but without a port per GPU the outer bandwidth)
    whole_s = ring(1, 16, grads, NET1_GBPS) + ring(1, 16, weights, NET1_GBPS)
    # hybrid: both within the 8 GPUs of one domain (inner network), then the shard's 1/8 of
    # the gradients all-reduced over the 2 replicas on the outer network
    hybrid_s = ring(1, 8, grads, NET0_GBPS) + ring(1, 8, weights, NET0_GBPS) + ring(2, 2, grads / 8, NET1_GBPS)
    assert evaluate(MODEL, system, dp16(1)).time.dp_comm_s == pytest.approx(whole_s, rel=1e-12)
    assert evaluate(MODEL, system, dp16(1, 8)).time.dp_comm_s == pytest.approx(hybrid_s, rel=1e-12)
    # a shard group spanning two domains stays on the outer network: 4 replicas of 4 GPUs each
    # reduce-scatter on it, the replica all-reduce too
    wide = Mapping(num_procs=32, tensor_par=4, pipeline_par=1, data_par=8, batch_size=8, microbatch_size=1,
                   sharding_stage=1, sharding_group=4, data_par_net=1)
    wide_s = (ring(1, 4, grads / 4, NET1_GBPS) + ring(1, 4, weights / 4, NET1_GBPS)
              + ring(2, 2, grads / 16, NET1_GBPS))
    assert evaluate(MODEL, system, wide).time.dp_comm_s == pytest.approx(wide_s, rel=1e-12)


def test_whole_group_is_the_default_and_a_file_may_say_it():
    assert dp16(1, 16) == dp16(1) and dp16(1).sharding_group is None
    with pytest.raises(ValueError, match=r"sharding_group\(3\) does not divide data_par\(16\)"):
        dp16(1, 3)


def test_count_grows_by_exactly_the_new_mappings():
    """full = the space with the whole group only, plus, for each of its mappings with a
    sharding stage >= 1, one mapping per power of two 2 <= s < dp·cp dividing dp·cp."""
    system = two_level_system()
    for gpus, cap in ((8, 8), (12, 12), (16, 4)):
        space = ring_only(get_space("full"))      # the K/V ring only: cp_comm is test_cp_comm.py's
        whole = enumerate_all(MODEL, system, gpus, cap, pinned(space, (("shard", (0,)),)))
        group = whole.columns["dp"].astype(np.int64) * whole.columns["cp"].astype(np.int64)
        extra = [sum(1 for k in range(1, 32) if 2**k < g and g % 2**k == 0) for g in group.tolist()]
        added = int(np.dot(whole.columns["zero"].astype(np.int64) > 0, extra))
        counted = count_mappings(MODEL, system, gpus, cap, space)
        assert counted.mappings == len(whole) + added > len(whole)
        assert len(enumerate_all(MODEL, system, gpus, cap, space)) == counted.mappings
        # the paper presets offer the whole group only
        for name in ("calculon-2023", "calculon-current"):
            paper = get_space(name)
            assert count_mappings(MODEL, system, gpus, cap, paper).mappings == \
                count_mappings(MODEL, system, gpus, cap, pinned(paper, (("shard", (0,)),))).mappings


def test_fix_shard_on_the_command_line(tmp_path):
    runner = CliRunner()
    args = ["count", "--model", "problems/models/gpt3-175b.yaml", "--system", "problems/systems/h100-80g-nvl8.yaml",
            "--gpus", "64", "--json"]
    every = runner.invoke(cli, args)
    fixed = [runner.invoke(cli, [*args, "--fix", f"shard={value}"]) for value in ("all", "2", "4", "8", "16", "32")]
    assert every.exit_code == 0 and all(r.exit_code == 0 for r in fixed), every.output

    total = json.loads(every.output)["mappings"]
    assert sum(json.loads(r.output)["mappings"] for r in fixed) == total
    bad = runner.invoke(cli, [*args, "--fix", "shard=3"])
    assert bad.exit_code != 0 and "shard" in bad.output and "Traceback" not in bad.output


# A slow outer network (6.25 GB/s, no port per GPU) and a tight HBM: ZeRO-2 over groups of
# 2 neighbours beats sharding over the whole dp·cp group (found by brute force).
SLOW_OUTER = H100.model_copy(update={"step": None, "networks": [
    H100.networks[0], H100.networks[1].model_copy(update={"port_per_gpu": False, "bandwidth_gbps": 6.25})]})
CASES = [("hbm4-32gpu", small_model(8, hidden=2048, heads=16), SLOW_OUTER.with_overrides(hbm_gib=4), 32, 64),
         ("hbm3-32gpu", small_model(8, hidden=2048, heads=16), SLOW_OUTER.with_overrides(hbm_gib=3), 32, 128)]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_solve_equals_brute_force_where_a_shard_group_wins(case):
    _, model, system, gpus, cap = case
    # the K/V ring only (cp > 1 mappings would come three times over: cp_comm is test_cp_comm.py's)
    space, kernels = ring_only(get_space("full")), Kernels.with_attention("fused", "16bit")
    result, _ = solve_equals_brute_force(model, system, gpus, cap, space, Datatype.bfloat16, kernels,
                                         time_limit_s=300)
    best = result.best.mapping
    assert best.sharding_group is not None and best.sharding_group < best.dp * best.cp


def test_block_floors_never_exceed_an_exact_time_with_shard_groups():
    """The floors (the DP table the least over the shard groups) sit at or below every feasible
    exact time of their blocks, shard groups of 2 to 8 of 16 GPUs on the slow outer network."""
    checked = assert_block_floors_below_exact(small_model(8, hidden=2048, heads=16), SLOW_OUTER.with_overrides(hbm_gib=4),
                                              16, 32, Datatype.bfloat16, ring_only(get_space("full")))
    assert any(sk.dp * sk.cp >= 4 for sk in checked)
