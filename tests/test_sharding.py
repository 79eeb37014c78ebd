"""ZeRO sharding stages 0-3 (the `zero` dimension): memory against the ZeRO paper's Figure 1,
a 70B model that no stage fits on 8 H100s, Calculon's `optimizer_sharding` still read as
stage 1, and the time terms' ordering."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import plain

from costmodel.space.choices import ShardingStage
from costmodel.errors import InputError
from costmodel.evaluate import evaluate, evaluate_arrays
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_mapping, load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from solver.search.solve import SolveStatus, SolverConfig, solve
from solver.space.declaration import get_space
from solver.space.enumerate import iter_chunks

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
STATE_TERMS = ("weights_bytes", "weight_grads_bytes", "optimizer_bytes", "embedding_bytes", "output_layer_bytes")

# Rajbhandari et al. 2020 (ZeRO), Figure 1: Ψ = 7.5B parameters, N_d = 64 data-parallel GPUs,
# mixed-precision Adam (K = 12 bytes of optimizer state per parameter), 16-bit weights and
# gradients: (2 + 2 + K)·Ψ = 120 GB; 2Ψ + 2Ψ + KΨ/N_d = 31.4 GB; 2Ψ + (2 + K)Ψ/N_d = 16.6 GB;
# (2 + 2 + K)Ψ/N_d = 1.9 GB per GPU.
ZERO_PAPER_PSI = 7.5e9
ZERO_PAPER_GB = {ShardingStage.none: 120.0, ShardingStage.optimizer: 31.4, ShardingStage.gradients: 16.6,
                 ShardingStage.parameters: 1.9}


def _gpt(blocks: int, hidden: int) -> Model:
    return Model(name="zero-paper", hidden=hidden, feedforward=4 * hidden, seq_size=1024, attn_heads=32,
                 attn_size=hidden // 32, num_blocks=blocks, vocab_size=51200)


@pytest.mark.parametrize("stage", list(ShardingStage))
def test_model_state_per_gpu_matches_the_zero_paper_figure_1(stage):
    model = _gpt(blocks=36, hidden=4096)            # ~7.5B parameters, as in the paper
    mapping = Mapping(num_procs=64, tensor_par=1, pipeline_par=1, data_par=64, batch_size=64, microbatch_size=1,
                      sharding_stage=stage, grad_datatype="16bit", datatype="bfloat16")
    mem = evaluate(model, H100, mapping).memory.as_dict()
    per_param = sum(mem[name] for name in STATE_TERMS) / model.total_params
    assert per_param == pytest.approx({"0": 16, "1": 4 + 12 / 64, "2": 2 + 14 / 64, "3": 16 / 64}[stage.value],
                                      rel=1e-12)
    assert round(per_param * ZERO_PAPER_PSI / 1e9, 1) == ZERO_PAPER_GB[stage]


def test_stage_3_keeps_the_gathered_blocks_and_a_gradient_bucket_beside_its_shards():
    model = _gpt(blocks=36, hidden=4096)
    kw = dict(num_procs=64, tensor_par=1, pipeline_par=1, data_par=64, batch_size=64, microbatch_size=1)
    mem = {s: evaluate(model, H100, Mapping(sharding_stage=s, **kw)).memory.sharding_buffer_bytes
           for s in ShardingStage}
    block = model.block_params
    assert mem[ShardingStage.none] == mem[ShardingStage.optimizer] == 0.0
    assert mem[ShardingStage.gradients] == pytest.approx(4.0 * block)          # fp32 main gradients
    assert mem[ShardingStage.parameters] == pytest.approx(4.0 * block + 2 * 2.0 * block)


def test_sharding_trades_memory_for_data_parallel_traffic():
    model = _gpt(blocks=8, hidden=2048)
    kw = dict(num_procs=16, tensor_par=1, pipeline_par=1, data_par=16, batch_size=64, microbatch_size=1)
    ev = {s: evaluate(model, H100, Mapping(sharding_stage=s, **kw)) for s in ShardingStage}
    hbm = [ev[s].hbm_bytes for s in ShardingStage]
    dp = [ev[s].time.dp_comm_s for s in ShardingStage]
    assert hbm[0] > hbm[1] > hbm[2] > hbm[3]
    # ZeRO-1 moves what an all-reduce moves; 2 reduce-scatters every microbatch; 3 also
    # all-gathers the weights twice every microbatch
    assert dp[1] == pytest.approx(dp[0], rel=0.05)
    assert dp[3] > dp[2] > dp[1]


def test_llama_70b_on_8_h100s_fits_no_sharding_stage_without_offload():
    """18 bytes per parameter (16-bit weights, fp32 main gradients, fp32 master and Adam
    moments) × 70.6B / 8 GPUs ≈ 159 GB per GPU even fully sharded: nothing fits in 80 GB."""
    model = load_model(ROOT / "problems/models/llama-3.1-70b/config.json", seq_size=8192)
    floor = 18 * model.total_params / 8
    assert floor > 158e9
    space = plain(get_space("full"))     # as before cp_comm and hybrid sharding (which only adds bytes)
    zero, least_bytes = set(), np.inf
    for _, rows in iter_chunks(model, H100, 8, 64, space, chunk_rows=1 << 16):     # (every mapping, in bounded memory)
        scored = evaluate_arrays(model, H100, rows, Datatype.bfloat16)
        assert not scored.feasible.any()
        zero |= set(np.unique(rows.zero).tolist())
        least_bytes = min(least_bytes, float(scored.hbm_bytes.min()))
    assert zero == {0, 1, 2, 3}
    assert least_bytes >= floor
    result = solve(model, H100, 8, max_batch=64, datatype=Datatype.bfloat16, space=space,
                   config=SolverConfig(time_limit_s=60))
    assert result.status == SolveStatus.infeasible
    assert any("hbm capacity" in reason and "GiB per GPU > 80.0 GiB HBM" in reason
               for reason in result.infeasible_reasons)


def test_calculon_optimizer_sharding_reads_as_stage_1_and_contradictions_are_named(tmp_path):
    kw = dict(num_procs=8, tensor_par=1, pipeline_par=1, data_par=8, batch_size=8, microbatch_size=1)
    assert Mapping(optimizer_sharding=True, **kw).sharding_stage is ShardingStage.optimizer
    assert Mapping(optimizer_sharding=False, **kw).sharding_stage is ShardingStage.none
    assert Mapping(sharding_stage=3, **kw).sharding_stage is ShardingStage.parameters
    assert Mapping(sharding_stage=2, **kw).model_dump(mode="json")["sharding_stage"] == 2
    with pytest.raises(ValueError, match=r"optimizer_sharding\(True\) contradicts sharding_stage\(3\)"):
        Mapping(optimizer_sharding=True, sharding_stage=3, **kw)
    with pytest.raises(ValueError, match="sharding_stage"):
        Mapping(sharding_stage=4, **kw)
    # files written with Calculon's field still load
    calculon = json.loads((ROOT / "problems/mappings/gpt-1.3b-bf16-8gpu.json").read_text())
    del calculon["sharding_stage"], calculon["grad_datatype"]
    (tmp_path / "calculon.json").write_text(json.dumps({**calculon, "optimizer_sharding": True}))
    legacy = load_mapping(tmp_path / "calculon.json")
    assert legacy.sharding_stage is ShardingStage.optimizer and legacy.optimizer_sharding


def test_grad_datatype_is_a_problem_setting_with_a_named_error():
    assert Kernels(grad_datatype="16bit").grad_datatype == "16bit"
    with pytest.raises(InputError, match="grad_datatype 'fp8' does not exist"):
        Kernels(grad_datatype="fp8")
    with pytest.raises(ValueError, match="grad_datatype"):
        Mapping(num_procs=1, tensor_par=1, pipeline_par=1, data_par=1, batch_size=1, microbatch_size=1,
                grad_datatype="fp8")


@pytest.mark.slow   # ~9 s: every block of the space (the default run keeps the other spaces' floor checks)
def test_block_floors_take_zero_2_and_3_traffic_per_microbatch_and_stay_below_exact_times():
    """The block floors take ZeRO-2/3's reduction at each block's microbatch count (its
    traffic is linear in them: solver.search.cpsat.tables, dp_once + n · dp_per_microbatch).
    A 1.3B model on 16 GPUs with 12 GiB of HBM and a batch of 64 needs a sharded stage with
    several microbatches per replica: every floor must stay at or below every feasible exact
    time of its block, and the answer equal brute force's."""
    from conftest import assert_block_floors_below_exact, solve_equals_brute_force

    model = _gpt(blocks=24, hidden=2048)
    system = H100.with_overrides(hbm_gib=12)
    checked = assert_block_floors_below_exact(model, system, 16, 64, Datatype.bfloat16)
    assert len(checked) > 20
    space = get_space("full")
    result, reference = solve_equals_brute_force(model, system, 16, 64, space, Datatype.bfloat16, Kernels(),
                                                 time_limit_s=300)
