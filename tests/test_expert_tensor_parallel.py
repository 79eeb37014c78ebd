"""Expert tensor parallelism (`etp`) and MoE parallel folding (ep·etp divides tp·cp·dp):
the declaration's rule, counts (closed form = enumeration = CP-SAT) that grow by exactly the
mappings folding adds, dense spaces untouched, cost terms by hand, mapping files and eval,
and solve == brute force where a folded or etp ≠ tp mapping wins."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_block_floors_below_exact, plain, solve_equals_brute_force
from test_expert_parallel import moe
from test_space_count import cp_sat_count, make_system

import solver.search.engine as engine_module
from costmodel.terms.context import Context
from costmodel.errors import InputError
from costmodel.evaluate import evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.mapping import Mapping, check_mapping_fits
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from solver.search.brute import scan
from solver.space.count import count_mappings
from solver.space.declaration import get_space, skeletons
from solver.space.enumerate import enumerate_all

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
MODEL = moe()                       # 8 experts of 1024, top 2, hidden 1024


def _mapping(tp=1, cp=1, ep=1, pp=1, dp=1, mb=1, batch=None, **more) -> Mapping:
    return Mapping(num_procs=tp * cp * pp * dp, tensor_par=tp, context_par=cp, expert_par=ep, pipeline_par=pp,
                   data_par=dp, batch_size=batch or dp * mb, microbatch_size=mb, **more)


# ---------------------------------------------------------------- the rule
def test_folding_lets_ep_exceed_dp_cp_and_names_every_factor():
    # ep 8 > dp·cp 4: the expert groups fold into tp·cp·dp = 8 GPUs when etp = 1
    check_mapping_fits(MODEL, H100, _mapping(tp=2, ep=8, dp=4, expert_tensor_par=1))
    with pytest.raises(InputError) as err:
        check_mapping_fits(MODEL, H100, _mapping(tp=2, ep=8, dp=4, expert_tensor_par=2))
    assert str(err.value).startswith("expert_par(8)·expert_tensor_par(2)=16 does not divide "
                                     "tensor_par(2)·context_par(1)·data_par(4)=8")
    # etp may exceed tp (the experts split wider than attention) and must divide the expert width
    check_mapping_fits(MODEL, H100, _mapping(tp=1, ep=2, dp=8, expert_tensor_par=4))
    wide = moe(expert_ff=1536)
    with pytest.raises(InputError, match=r"expert_tensor_par\(1024\) does not divide expert_feedforward\(1536\)"):
        check_mapping_fits(wide, H100, _mapping(dp=1024, expert_tensor_par=1024))
    dense = MODEL.model_copy(update={"num_experts": 0, "experts_per_token": 0, "expert_feedforward": 0})
    with pytest.raises(InputError, match=r"expert_tensor_par\(2\) needs a mixture-of-experts model"):
        check_mapping_fits(dense, H100, _mapping(tp=2, dp=2, expert_tensor_par=2))


def test_an_unstated_etp_is_tp_for_an_moe_model_and_1_for_a_dense_one():
    """Megatron-LM parallel_state.initialize_model_parallel: `if expert_tensor_parallel_size is
    None: expert_tensor_parallel_size = tensor_model_parallel_size`."""
    mapping = _mapping(tp=2, ep=4, dp=4, tensor_par_comm_type="rs_ag")
    assert mapping.expert_tensor_par is None and "expert_tensor_par" not in mapping.model_dump()
    assert evaluate(MODEL, H100, mapping).mapping.etp == 2
    dense = MODEL.model_copy(update={"num_experts": 0, "experts_per_token": 0, "expert_feedforward": 0})
    assert evaluate(dense, H100, _mapping(tp=4, dp=2)).mapping.etp == 1
    stated = evaluate(MODEL, H100, mapping.model_copy(update={"expert_tensor_par": 2}))
    assert stated.iteration_time_s == evaluate(MODEL, H100, mapping).iteration_time_s


# ---------------------------------------------------------------- counts
# The counts of these spaces under the rule before folding (ep divides dp·cp, etp = tp), by the
# closed form of commit e6614c3 (equal to its enumeration there); one network, so etp's network
# flag adds no choice and every earlier mapping is one mapping now.
MODEL_SHAPE = {"hidden": 24, "feedforward": 96, "seq_size": 8, "attn_heads": 4, "attn_size": 6, "num_blocks": 4,
               "experts_per_token": 2, "expert_feedforward": 24}
BEFORE_FOLDING = [
    # (experts, gpus, cap, offload, space, count before); `full` with the K/V ring and the whole
    # group only, as it was then (cp_comm and hybrid sharding came later)
    (8, 8, 8, False, "full", 40480), (8, 8, 8, False, "calculon-2023", 3344),
    (4, 4, 4, False, "full", 8305), (4, 4, 4, False, "calculon-2023", 1067),
    (6, 6, 3, True, "full", 27360), (6, 6, 3, True, "calculon-2023", 3648),
]


@pytest.mark.parametrize("experts, gpus, cap, offload, space, before", BEFORE_FOLDING)
def test_count_grows_by_exactly_the_folded_and_etp_mappings(experts, gpus, cap, offload, space, before):
    model = Model(**MODEL_SHAPE, num_experts=experts)
    system, space = make_system(1, offload), plain(get_space(space))
    counted = count_mappings(model, system, gpus, cap, space)
    arrays = enumerate_all(model, system, gpus, cap, space)
    assert counted.mappings == len(arrays)
    tp, cp, dp, ep, etp = (arrays.columns[n].astype(np.int64) for n in ("tp", "cp", "dp", "ep", "etp"))
    # independent filter: what the earlier rule refused (etp ≠ tp, or ep not dividing dp·cp)
    new_only = (etp != tp) | ((dp * cp) % ep != 0)
    assert counted.mappings == before + int(np.count_nonzero(new_only))
    assert np.count_nonzero(new_only) > 0 and np.count_nonzero((dp * cp) % ep != 0) > 0   # folding adds some
    assert np.all((tp * cp * dp) % (ep * etp) == 0) and np.all(experts % ep == 0) and np.all(24 % etp == 0)
    assert np.all((arrays.etp_net == 0) | (etp > 1))


@pytest.mark.parametrize("experts, gpus, cap, networks, offload", [
    (8, 4, 4, 2, False), pytest.param(4, 4, 2, 1, True, marks=pytest.mark.slow)])   # 13 s: offload, one network
def test_closed_form_equals_enumeration_and_cp_sat_with_etp(experts, gpus, cap, networks, offload):
    model = Model(**MODEL_SHAPE, num_experts=experts)
    system = make_system(networks, offload)
    space = get_space("calculon-2023")           # CP-SAT lists every solution: the smaller preset
    counted = count_mappings(model, system, gpus, cap, space)
    assert counted.mappings == len(enumerate_all(model, system, gpus, cap, space))
    assert counted.mappings == cp_sat_count(model, system, gpus, cap, space)
    assert sum(v for k, v in counted.by_dimension["etp"].items() if k != "1") > 0
    if networks > 1:
        assert counted.by_dimension["etp_net"]["1"] > 0       # etp's own network is a choice when etp > 1


def test_dense_spaces_keep_etp_1_and_their_counts():
    # the brief's 1T model on 4,096 GPUs: the published count (docs/mapping-space.md)
    from costmodel.inputs.load import load_model
    model = load_model(ROOT / "problems/models/gpt-1t-256b.yaml")
    system = H100.with_overrides(offload_gib=1024)
    assert count_mappings(model, system, 4096, 3072, get_space("calculon-2023")).mappings == 15_612_832
    assert {(s.ep, s.etp) for s in skeletons(model, 4096, 3072, get_space("full"))} == {(1, 1)}


# ---------------------------------------------------------------- cost terms
def test_expert_gradients_reduce_over_edp_when_folded():
    """tp 2, ep 8 > dp·cp = 4, etp 1: edp = tp·cp·dp/(ep·etp) = 1, so the experts' gradients
    are not reduced at all, while the dense part all-reduces over dp·cp = 4 (ZeRO-0)."""
    mapping = _mapping(tp=2, ep=8, dp=4, expert_tensor_par=1, tensor_par_comm_type="rs_ag", batch=4)
    ev = evaluate(MODEL, H100, mapping)
    c = Context.build(MODEL, H100, Datatype.bfloat16, Kernels())
    net = H100.networks[0]
    rate = net.bandwidth_bytes_per_s * net.efficiency
    dense = (4 * (c.model.moe_block_params - c.model.routed_expert_params - c.model.router_params) / 2 + 4 * c.model.router_params
             + (c.model.embedding_params + c.model.output_layer_params) / 2)
    # dp's group is 4 GPUs tp·cp·pp = 2 apart: within one 8-GPU NVLink domain (members 4)
    expected = net.latency_s + 2 * dense * 2 * 3 / 4 / rate
    assert ev.time.dp_comm_s == pytest.approx(expected, rel=1e-12)
    # the experts whole on each GPU (etp 1), one of the 8 experts each
    routed = MODEL.routed_expert_params / 8
    assert ev.memory.weights_bytes == pytest.approx(
        2 * 4 * ((c.model.moe_block_params - c.model.routed_expert_params - c.model.router_params) / 2 + c.model.router_params + routed),
        rel=1e-12)


def test_expert_gradients_reduce_over_edp_with_dp_and_cp_1():
    """tp 4, ep 2, etp 1 on 4 GPUs (dp = cp = 1): edp = 4/(2·1) = 2 GPUs reduce the experts'
    gradients, on tp's network (the innermost dense group spanning tp·cp·dp)."""
    mapping = _mapping(tp=4, ep=2, dp=1, expert_tensor_par=1, tensor_par_comm_type="rs_ag", batch=2)
    ev = evaluate(MODEL, H100, mapping)
    c = Context.build(MODEL, H100, Datatype.bfloat16, Kernels())
    net = H100.networks[0]
    experts = 4 * c.model.routed_expert_params / 2
    expected = net.latency_s + 2 * experts * 2 * 1 / 2 / (net.bandwidth_bytes_per_s * net.efficiency)
    assert ev.time.dp_comm_s == pytest.approx(expected, rel=1e-12)


def test_the_ep_group_spans_etp_ep_gpus_and_lands_on_the_network_that_holds_it():
    """The ep group's span is etp·ep (costmodel.space.dimensions.DEGREES): ep 16 with etp 1 spans
    16 GPUs, more than the 8 of NVLink, so on network 0 it is infeasible; ep 8 with etp 1 fits
    where ep 8 with etp 2 (16) does not."""
    big = moe(experts=16)
    def reasons(ep, etp, net):
        return evaluate(big, H100, _mapping(tp=2, ep=ep, dp=8, expert_tensor_par=etp, expert_par_net=net,
                                            data_par_net=1, tensor_par_comm_type="rs_ag")).reasons

    assert "network: a ep group spans 16 GPUs > network 0 size 8" in reasons(16, 1, 0)
    assert reasons(16, 1, 1) == () and reasons(8, 1, 0) == ()
    assert "network: a ep group spans 16 GPUs > network 0 size 8" in reasons(8, 2, 0)


# ---------------------------------------------------------------- eval
def test_eval_of_a_folded_mapping_and_a_one_line_error(tmp_path):
    model_file = tmp_path / "moe.json"
    model_file.write_text(json.dumps(moe(experts=64).model_dump(mode="json")))
    mapping = _mapping(tp=2, ep=32, dp=16, expert_tensor_par=1, tensor_par_comm_type="rs_ag", expert_par_net=1,
                       data_par_net=1, batch=32).model_dump(mode="json")
    good = tmp_path / "folded.json"
    good.write_text(json.dumps(mapping))
    args = ["eval", "--model", str(model_file), "--system", str(ROOT / "problems/systems/h100-80g-nvl8.yaml")]
    result = CliRunner().invoke(cli, [*args, "--mapping", str(good), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["time"]["ep_comm_s"] > 0 and out["mapping"]["expert_tensor_par"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**mapping, "expert_par": 64, "expert_tensor_par": 2}))
    result = CliRunner().invoke(cli, [*args, "--mapping", str(bad)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert ("expert_par(64)·expert_tensor_par(2)=128 does not divide tensor_par(2)·context_par(1)·data_par(16)=32"
            in result.output)
    assert math.isfinite(out["iteration_time_s"])


# ---------------------------------------------------------------- solve == brute force
def _attention_heavy(seq, experts, top_k, expert_ff):
    """Two blocks of 4,096-wide grouped-query attention over long sequences, with small experts:
    tp > 1 pays for the attention, and the experts run best whole (etp 1) or spread (folded)."""
    return moe(blocks=2, hidden=4096, heads=32, kv_heads=8, seq=seq, experts=experts, top_k=top_k,
               expert_ff=expert_ff)


FOLDING_CASES = [
    # (id, model, system, gpus, max_batch, what wins) — found by brute force (`scan`) on the exact
    # model; in each the best mapping is one the rule before folding refused
    ("etp1-under-tp2", _attention_heavy(8192, 32, 4, 768), H100.with_overrides(hbm_gib=12), 8, 4, "etp != tp"),
    ("etp1-under-tp4", _attention_heavy(8192, 16, 2, 1024), H100.with_overrides(hbm_gib=10), 8, 2, "etp != tp"),
    ("ep8-folded-into-tp8", _attention_heavy(8192, 32, 4, 768), H100.with_overrides(hbm_gib=6), 8, 1, "folded"),
]


def _folding_wins(mapping) -> bool:
    return mapping.etp != mapping.tp or mapping.ep > mapping.dp * mapping.cp


def _solve_and_scan(model, system, gpus, max_batch):
    space = plain(get_space("full"))             # as before cp_comm and shard
    result, reference = solve_equals_brute_force(model, system, gpus, max_batch, space, Datatype.bfloat16,
                                                 Kernels(), top_k=3, time_limit_s=300)
    assert _folding_wins(reference.best.mapping)
    return result, reference


@pytest.mark.parametrize("case", FOLDING_CASES, ids=[c[0] for c in FOLDING_CASES])
def test_solve_equals_brute_force_where_folding_or_etp_wins(case):
    _, model, system, gpus, max_batch, wins = case
    _, reference = _solve_and_scan(model, system, gpus, max_batch)
    best = reference.best.mapping
    assert (best.ep > best.dp * best.cp) if wins == "folded" else (best.etp != best.tp)


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0], marks=pytest.mark.slow if c[0] == "etp1-under-tp2" else ())
                                  for c in FOLDING_CASES[::2]])   # etp1-under-tp2: 12 s, in the slow run
def test_the_cp_sat_path_alone_certifies_the_folded_answer(case, monkeypatch):
    """No warm start and no proof from the block floors: CP-SAT's rounds over the surrogate
    (its tables keyed by etp, minimised over etp_net) must reach the same optimum."""
    monkeypatch.setattr(engine_module, "WARM_START_BLOCKS", 0)
    monkeypatch.setattr(engine_module, "floors_prove", lambda *args: False)
    _, model, system, gpus, max_batch, _ = case
    result, _ = _solve_and_scan(model, system, gpus, max_batch)
    assert result.rounds > 0


def test_block_floors_never_exceed_an_exact_time_with_etp():
    model = _attention_heavy(8192, 32, 4, 768)
    checked = assert_block_floors_below_exact(model, H100.with_overrides(hbm_gib=12), 8, 4, Datatype.bfloat16,
                                              plain(get_space("full")))
    assert any(sk.etp != sk.tp for sk in checked) and any(sk.ep > sk.dp * sk.cp for sk in checked)


# ---------------------------------------------------------------- dense models unchanged
DENSE = Model(name="dense", hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=4,
              kv_heads=4, mlp="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False, bias=False,
              vocab_size=32000)


def test_a_dense_model_keeps_its_count_and_answers():
    """Golden figures from the code before etp (the commit before it was merged, 04cd912:
    `count_mappings`, `scan` and `evaluate` on the same inputs, the H100 file without its
    whole-step terms, which are refitted as the runs grow), unchanged to 1e-12 (bit for bit
    until a block became the sum of its layers' records, which adds the same terms in another
    order): a dense model has ep = etp = 1. The space is `full` with the K/V ring and the whole group only, as
    it was then (cp_comm and hybrid sharding came later and add mappings)."""
    h100 = H100.model_copy(update={"step": None})
    system = h100.with_overrides(hbm_gib=16)
    full = plain(get_space("full"))
    assert count_mappings(DENSE, system, 8, 16, full).mappings == 138_952
    reference = scan(DENSE, system, 8, 16, full, Datatype.bfloat16, Kernels(), top_k=3, workers=1)
    assert [e.iteration_time_s for e in reference.top] == pytest.approx(
        [0.016231016460527964, 0.016231016460527964, 0.016331731304972407], rel=1e-12)
    assert {(e.mapping.ep, e.mapping.etp, e.mapping.expert_tensor_par_net) for e in reference.top} == {(1, 1, 0)}
    # dp = cp = 1, tp 4: the gradient group's network is now tp's, with nothing to reduce
    mapping = Mapping(num_procs=8, tensor_par=4, pipeline_par=2, data_par=1, batch_size=8, microbatch_size=1,
                      tensor_par_comm_type="rs_ag", pipeline_par_net=1, pipeline_interleaving=2)
    ev = evaluate(DENSE, h100, mapping)
    assert (ev.iteration_time_s, ev.hbm_bytes) == pytest.approx((0.022025588549565787, 3257339904.0), rel=1e-12)


# ---------------------------------------------------------------- measured runs
def _run(**more):
    from costmodel.measured.runs import Run
    return Run.model_validate({"name": "moe-run", "model": moe(experts=64).model_dump(mode="json"),
                               "system": "h100-80g-nvl8", "num_gpus": 64, "seq_size": 2048, "global_batch": 64,
                               "tp": 2, "pp": 2, "ep": 32, **more})


def test_a_run_s_etp_reaches_its_mapping_and_an_unstated_one_is_a_named_gap():
    """A Run (and a Megatron-Bridge row) states etp; the mapping takes it, its networks from
    the folded groups' spans (ep spans etp·ep = 32 GPUs: the inter-node network on 8-GPU
    nodes). Unstated, etp is Megatron-LM's default tp, named among the run's gaps."""
    from costmodel.measured.run_bridge import BridgeRow
    from costmodel.measured.run_mapping import map_run
    folded = map_run(_run(etp=1), moe(experts=64), H100)
    assert folded.mapping.etp == 1 and folded.mapping.ep > folded.mapping.dp      # ep 32 on dp 16
    assert folded.mapping.expert_par_net == 1 and folded.mapping.expert_tensor_par_net == 0
    assert not any("expert tensor" in gap for gap in folded.not_expressible)
    with pytest.raises(InputError, match=r"expert_par\(32\)·expert_tensor_par\(2\)=64 does not divide"):
        check_mapping_fits(moe(experts=64), H100, map_run(_run(), moe(experts=64), H100).mapping)
    assert any("costed as tp (2)" in gap for gap in map_run(_run(ep=8), moe(experts=64), H100).not_expressible)
    assert "etp" in BridgeRow.model_fields
