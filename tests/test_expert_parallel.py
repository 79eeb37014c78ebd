"""Expert parallelism (the `ep` dimension) for mixture-of-experts models: its rule and
counts (closed form = enumeration = CP-SAT), its cost terms against hand computations, the
block floors' soundness, and solve == brute force (certified) where MoE models are mapped."""

from pathlib import Path

import numpy as np
import pytest

from conftest import cases, plain, solve_equals_brute_force
from costmodel.terms.context import Context
from costmodel.errors import InputError
from costmodel.evaluate import evaluate, evaluate_arrays
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.mapping import Mapping, check_mapping_fits
from costmodel.inputs.model import Model
from costmodel.inputs.system import Collective, Datatype
from solver.search.cpsat.surrogate import add_bounds
from solver.search.cpsat.model import local_batches, structure_model
from solver.search.solve import SolverConfig, solve
from solver.search.cpsat.constraints import Problem
from solver.space.count import count_mappings
from solver.space.declaration import get_space, skeletons
from solver.space.enumerate import enumerate_all, plan
from test_space_count import cp_sat_count, make_system

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")


def moe(blocks=4, hidden=1024, heads=16, kv_heads=4, seq=2048, experts=8, top_k=2, expert_ff=1024, shared_ff=0,
        every=1) -> Model:
    return Model(name=f"moe{experts}x{top_k}", hidden=hidden, feedforward=4 * hidden, seq_size=seq, attn_heads=heads,
                 attn_size=hidden // heads, num_blocks=blocks, kv_heads=kv_heads, mlp="swiglu", norm="rmsnorm",
                 position="rope", tied_embeddings=False, bias=False, vocab_size=32000, num_experts=experts,
                 experts_per_token=top_k, expert_feedforward=expert_ff, shared_experts=1 if shared_ff else 0,
                 shared_expert_feedforward=shared_ff, moe_every=every)


MODEL = moe()


def _mapping(tp=1, cp=1, ep=1, pp=1, dp=1, mb=1, batch=None, zero=0, **more) -> Mapping:
    return Mapping(num_procs=tp * cp * pp * dp, tensor_par=tp, context_par=cp, expert_par=ep, pipeline_par=pp,
                   data_par=dp, batch_size=batch or dp * mb, microbatch_size=mb, sharding_stage=zero,
                   tensor_par_net=0, expert_par_net=more.pop("expert_par_net", 0), data_par_net=0, **more)


# ---------------------------------------------------------------- the rule and the counts
def test_ep_divides_the_experts_and_dp_cp_and_a_dense_model_has_none():
    check_mapping_fits(MODEL, H100, _mapping(ep=8, dp=8))
    check_mapping_fits(MODEL, H100, _mapping(ep=4, dp=2, cp=2, context_par_net=0))
    with pytest.raises(InputError, match=r"expert_par\(3\) does not divide num_experts\(8\)"):
        check_mapping_fits(MODEL, H100, _mapping(ep=3, dp=3))
    # MoE parallel folding: ep·etp divides tp·cp·dp (etp defaults to tp for an MoE model)
    with pytest.raises(InputError, match=r"expert_par\(4\)·expert_tensor_par\(1\)=4 does not divide "
                                         r"tensor_par\(1\)·context_par\(1\)·data_par\(2\)=2"):
        check_mapping_fits(MODEL, H100, _mapping(ep=4, dp=2))
    with pytest.raises(InputError, match=r"expert_par\(4\)·expert_tensor_par\(2\)=8 does not divide "
                                         r"tensor_par\(2\)·context_par\(1\)·data_par\(2\)=4"):
        check_mapping_fits(MODEL, H100, _mapping(tp=2, ep=4, dp=2))
    check_mapping_fits(MODEL, H100, _mapping(tp=2, ep=4, dp=2, expert_tensor_par=1))   # folded: ep > dp·cp
    dense = MODEL.model_copy(update={"num_experts": 0, "experts_per_token": 0, "expert_feedforward": 0})
    with pytest.raises(InputError, match=r"expert_par\(2\) needs a mixture-of-experts model"):
        check_mapping_fits(dense, H100, _mapping(ep=2, dp=2))
    assert {s.ep for s in skeletons(dense, 64, 64, get_space("full"))} == {1}


@pytest.mark.parametrize("experts, gpus, cap, networks, offload, every", [
    (8, 4, 4, 1, False, 1), pytest.param(4, 8, 4, 2, False, 2, marks=pytest.mark.slow), (6, 6, 3, 1, True, 1)])
def test_counts_agree_with_expert_parallelism(experts, gpus, cap, networks, offload, every):
    model = Model(hidden=24, feedforward=96, seq_size=8, attn_heads=4, attn_size=6, num_blocks=4,
                  num_experts=experts, experts_per_token=2, expert_feedforward=24, moe_every=every)
    system = make_system(networks, offload)
    for space in (plain(get_space("full")), get_space("calculon-2023")):   # as before cp_comm, shard
        counted = count_mappings(model, system, gpus, cap, space)
        arrays = enumerate_all(model, system, gpus, cap, space)
        assert counted.mappings == len(arrays)
        if space.name == "calculon-2023":       # CP-SAT enumerates each solution: the smaller space
            assert counted.mappings == cp_sat_count(model, system, gpus, cap, space)
        assert sum(v for k, v in counted.by_dimension["ep"].items() if k != "1") > 0
        ep, dp, cp = arrays.ep.astype(int), arrays.dp.astype(int), arrays.cp.astype(int)
        tp, etp = arrays.tp.astype(int), arrays.etp.astype(int)
        assert np.all(experts % ep == 0) and np.all((tp * cp * dp) % (ep * etp) == 0)
        assert np.all((arrays.ep_net == 0) | (ep > 1))            # the EP network is free only when ep > 1


# ---------------------------------------------------------------- cost terms by hand
def test_all_to_all_term_by_hand():
    """ep_comm_s = microbatches · blocks · 4 all-to-alls (dispatch and combine, forward and
    backward) of e·(T/t)·k·c·h bytes each, on the EP network: latency + bytes·factor·(ep +
    offset)/ep / bandwidth (Collective.all_to_all)."""
    kernels = Kernels(capacity_factor=1.25)
    mapping = _mapping(tp=2, ep=4, dp=4, mb=2, batch=32, expert_par_net=1, capacity_factor=1.25)
    ev = evaluate(MODEL, H100, mapping)
    c = Context.build(MODEL, H100, Datatype.bfloat16, kernels)
    message = 2 * (2 * 2048 / 2) * 2 * 1.25 * 1024                # e · (b·s/t) · k · c · h
    net = H100.networks[1]
    wire = message * c.net.factor[Collective.all_to_all][1] * (4 + c.net.offset[Collective.all_to_all][1]) / 4
    one = net.latency_s + wire / (net.bandwidth_bytes_per_s * net.efficiency)
    microbatches = 32 / 4 / 2
    assert ev.time.ep_comm_s == pytest.approx(microbatches * 4 * 4 * one, rel=1e-12)
    assert sum(ev.time.as_dict().values()) == pytest.approx(ev.iteration_time_s, rel=1e-12)


def test_expert_weights_per_gpu_and_their_sharding_by_hand():
    """Weights: attention, router and shared parts split tp ways (router whole), the E/ep
    local experts split tp ways; ZeRO-1 shards the dense-group optimizer state over dp·cp
    and the experts' over dp·cp/ep."""
    model = moe(shared_ff=512)
    mapping = _mapping(tp=2, ep=2, dp=4, zero=1)
    ev = evaluate(model, H100, mapping)
    routed = model.routed_expert_params
    dense_part = (model.moe_block_params - routed - model.router_params) / 2 + model.router_params
    expert_part = routed / (2 * 2)
    assert ev.memory.weights_bytes == pytest.approx(4 * 2 * (dense_part + expert_part), rel=1e-12)
    optimizer = 4 * 12 * (dense_part / 4 + expert_part / 2)       # 12 B/param: fp32 master + two moments
    assert ev.memory.optimizer_bytes == pytest.approx(optimizer, rel=1e-12)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """ZeRO-0, no overlap: the dense-group gradients all-reduce over dp·cp = 4 GPUs and the
    experts' over dp·cp/ep = 2 (Megatron-LM's expert data-parallel group)."""
    mapping = _mapping(ep=2, dp=4, batch=4)
    ev = evaluate(MODEL, H100, mapping)
    c = Context.build(MODEL, H100, Datatype.bfloat16, Kernels())
    net = H100.networks[0]
    rate = net.bandwidth_bytes_per_s * net.efficiency

    def all_reduce(group, params):
        return net.latency_s + 2 * params * 2 * (group - 1) / group / rate

    dense = 4 * (c.model.moe_block_params - c.model.routed_expert_params) + c.model.embedding_params + c.model.output_layer_params
    experts = 4 * c.model.routed_expert_params / 2
    assert ev.time.dp_comm_s == pytest.approx(all_reduce(4, dense) + all_reduce(2, experts), rel=1e-12)


def test_model_flops_count_active_parameters():
    ev = evaluate(MODEL, H100, _mapping(ep=8, dp=8))
    assert MODEL.active_params < MODEL.total_params
    tokens = ev.mapping.batch_size * MODEL.seq_size
    assert ev.mfu == pytest.approx(MODEL.model_flops_per_sample() * ev.mapping.batch_size
                                   / (ev.iteration_time_s * 8 * H100.compute_for(Datatype.bfloat16).matrix_flops_per_s))
    assert MODEL.model_flops_per_sample() < 6 * MODEL.total_params * MODEL.seq_size and tokens > 0


def test_a_dense_model_pays_no_expert_terms():
    dense = MODEL.model_copy(update={"num_experts": 0, "experts_per_token": 0, "expert_feedforward": 0})
    ev = evaluate(dense, H100, _mapping(tp=2, dp=4))
    assert ev.time.ep_comm_s == 0.0


# ---------------------------------------------------------------- bounds and the solver
@pytest.mark.slow   # 19 s: every block of two MoE spaces evaluated exactly
def test_block_floors_never_exceed_an_exact_time_in_their_block():
    model, gpus, cap = moe(every=2, shared_ff=512), 16, 32
    system = H100.with_overrides(hbm_gib=12)
    space = plain(get_space("full"))             # as before cp_comm and shard
    problem = Problem(model, system, gpus, cap, space)
    skels = skeletons(model, gpus, cap, space)
    c = Context.build(model, system, Datatype.bfloat16, Kernels())
    m, v = structure_model(problem, skels, flags=None)
    bounds = add_bounds(m, v, c, gpus, local_batches(problem, v), space, c.memory.hbm_capacity_bytes,
                        skeletons=skels)
    the_plan = plan(model, system, gpus, cap, space)
    index = {s.split: i for i, s in enumerate(skels)}
    checked = 0
    for key, floor in bounds.block_floors.items():
        rows, _ = the_plan.block(index[key.split], key.interleaving, key.microbatch)
        ev = evaluate_arrays(model, system, rows, Datatype.bfloat16, Kernels())
        if ev.feasible.any():
            assert floor <= ev.iteration_time_s[ev.feasible].min(), key
            checked += 1
        else:
            assert floor >= 0
    assert checked > 0 and any(k.ep > 1 for k in bounds.block_floors)


CASES = [
    # (id, model, system, gpus, max_batch, expects ep > 1)
    ("8x2-tight-hbm-16gpu", moe(), H100.with_overrides(hbm_gib=8), 16, 32, True),
    ("shared-every2-8gpu", moe(every=2, shared_ff=2048), H100, 8, 16, True),
    ("8blocks-32gpu", moe(blocks=8, hidden=2048, expert_ff=1408), H100.with_overrides(hbm_gib=16), 32, 64, True),
    ("top1-wide-experts-16gpu", moe(experts=4, top_k=1, expert_ff=4096, every=2), H100, 16, 16, None),
]


@pytest.mark.parametrize("case", cases(CASES, slow={"8blocks-32gpu": "~10 s: brute force over 32 GPUs",
                                                   "8x2-tight-hbm-16gpu": "~8 s: brute force over 16 GPUs",
                                                   "top1-wide-experts-16gpu": "~7 s: brute force over 16 GPUs"}))
def test_solve_equals_brute_force_on_moe_models(case):
    _, model, system, gpus, max_batch, ep_wins = case
    space = plain(get_space("full"))             # as before cp_comm and shard
    _, reference = solve_equals_brute_force(model, system, gpus, max_batch, space, Datatype.bfloat16, Kernels(),
                                            top_k=2, time_limit_s=300)
    if ep_wins:
        assert reference.best.mapping.ep > 1


@pytest.mark.slow   # ~8 s: brute force over 16 GPUs (the default run keeps an 8-GPU MoE case)
def test_solve_equals_brute_force_with_the_flex_dispatcher():
    # DeepEP / HybridEP dispatch (a problem setting): the search's per-key choice of the ep
    # network stays exact, as the dispatch only grows the block's time.
    model, system, gpus, max_batch = moe(), H100.with_overrides(hbm_gib=8), 16, 32
    kernels = Kernels(moe_dispatcher="flex")
    space = plain(get_space("full"))                  # the dispatcher's question, not cp_comm's or the shard's
    solve_equals_brute_force(model, system, gpus, max_batch, space, Datatype.bfloat16, kernels, top_k=2,
                             time_limit_s=300)


def test_the_search_refuses_the_ep_overlap():
    with pytest.raises(InputError, match="moe_comm_overlap: the search does not take"):
        solve(moe(), H100, 8, max_batch=16, datatype=Datatype.bfloat16, space=get_space("full"),
              kernels=Kernels(moe_comm_overlap=True), config=SolverConfig(top_k=1, time_limit_s=60, workers=1))
