"""cp_comm, the context-parallel communication type (p2p ring | all_gather | a2a): the count
grows by exactly the new mappings, the terms match a hand computation from the alpha-beta
collective model, a2a's heads rule, a file's default and `--fix`, and solve == brute force
where a2a wins and, with all three free, on more of test_context_parallel's problems (which
that file solves with the K/V ring only). Every space here shards over the whole group (hybrid
sharding is tests/test_hybrid_sharding.py's)."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_block_floors_below_exact, solve_equals_brute_force, whole_group
from test_context_parallel import CASES, H100, MODEL, _mapping, gqa
from test_space_count import make_system

from costmodel.space.choices import CPComm
from costmodel.evaluate import evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from solver.space.count import count_mappings
from solver.space.declaration import get_space
from solver.space.pins import pinned

ROOT = Path(__file__).resolve().parents[1]


def _count(model, gpus, space):
    return count_mappings(model, make_system(), gpus, 8, space).mappings


@pytest.mark.parametrize("gpus", [4, 8, 16])
def test_count_grows_by_exactly_two_copies_of_the_mappings_with_cp(gpus):
    """p2p keeps every mapping there was; all_gather and a2a each add one per mapping with cp > 1."""
    model = gqa(4, 1024, 16, 8, 8192)
    full = whole_group(get_space("full"))
    total = _count(model, gpus, full)
    ring = _count(model, gpus, pinned(full, (("cp_comm", (0,)),)))
    without_cp = _count(model, gpus, pinned(full, (("cp", (1,)),)))
    assert ring > without_cp                      # the space has mappings with cp > 1
    assert total == ring + 2 * (ring - without_cp)
    for name in ("calculon-2023", "calculon-current"):   # no cp: nothing changes
        assert _count(model, gpus, get_space(name)) == _count(model, gpus, pinned(get_space(name), (("cp_comm", (0,)),)))


def _cp_time(mapping):
    ev = evaluate(MODEL, H100, mapping)
    return ev, ev.time.cp_comm_s


def test_all_gather_and_a2a_match_a_hand_computation():
    """One mapping (tp 2, cp 4, mb 1, 8 blocks of a 32-head, 8-KV-head, d 128 model at 32K,
    bf16, on H100 NVLink): the per-block CP bytes by hand, through the alpha-beta model
    latency + B·factor·(n+offset)/n / (bandwidth·efficiency) read from the system file."""
    net = H100.networks[0]
    rate = net.bandwidth_gbps * 1e9 * net.efficiency
    latency = net.latency_us * 1e-6
    e, b, s, tp, cp, d = 2, 1, 32768, 2, 4, 128
    kv_local = e * b * s / cp * 2 * 8 / tp * d            # this GPU's K and V
    # all_gather: K, V gathered (message: the whole sequence, (n-1)/n leaves) forward; gathered
    # again and dK, dV reduce-scattered backward: 2 + 4 collectives per block
    half = cp * kv_local / 2
    gather = latency + half * (cp - 1) / cp / rate
    ag_block = 2 * gather + (2 * gather + 2 * gather)     # reduce-scatter moves the same bytes
    # a2a: Q, K, V, O forward and their gradients backward, (n-1)/n of each leaves the GPU
    q = e * b * s / cp * 32 / tp * d
    pieces = (q, kv_local / 2, kv_local / 2, q)
    a2a_block = 2 * sum(latency + p * (cp - 1) / cp / rate for p in pieces)
    blocks_times_microbatches = 8 * 1
    _, ag = _cp_time(_mapping(tp=2, cp=4, context_par_comm="all_gather"))
    _, a2a = _cp_time(_mapping(tp=2, cp=4, context_par_comm="a2a"))
    _, ring = _cp_time(_mapping(tp=2, cp=4))
    assert ag == pytest.approx(blocks_times_microbatches * ag_block, rel=1e-9)
    assert a2a == pytest.approx(blocks_times_microbatches * a2a_block, rel=1e-9)
    assert ring > 0 and len({ag, a2a, ring}) == 3


def test_a2a_runs_the_core_on_the_whole_sequence_with_fewer_heads_and_keeps_its_buffers():
    """The same FLOP (MFU numerator equal), another kernel; all_gather's workspace holds 2·cp
    chunks of K and V (gathered K, V and their gradients), the ring's 2."""
    ring, _ = _cp_time(_mapping(tp=2, cp=4))
    ag, _ = _cp_time(_mapping(tp=2, cp=4, context_par_comm="all_gather"))
    a2a, _ = _cp_time(_mapping(tp=2, cp=4, context_par_comm="a2a"))
    assert ring.flops.per_token == a2a.flops.per_token == ag.flops.per_token
    assert a2a.time != ring.time
    assert ag.hbm_bytes > ring.hbm_bytes


def test_a2a_needs_cp_to_divide_the_kv_heads_per_tp_rank():
    ev = evaluate(MODEL, H100, _mapping(tp=2, cp=8, context_par_comm="a2a", context_par_net=1))
    assert not ev.feasible
    assert any("a2a needs kv_heads(8)/tensor_par(2) divisible by context_par(8)" in r for r in ev.reasons)
    assert evaluate(MODEL, H100, _mapping(tp=2, cp=4, context_par_comm="a2a")).feasible


def test_a_file_defaults_to_the_ring_and_round_trips():
    m = _mapping(tp=2, cp=4)
    assert m.context_par_comm is CPComm.p2p
    again = Mapping.model_validate(_mapping(tp=2, cp=4, context_par_comm="a2a").model_dump(mode="json"))
    assert again.context_par_comm is CPComm.a2a


def test_fix_cp_comm_a2a_on_the_command_line():
    result = CliRunner().invoke(cli, ["count", "--model", str(ROOT / "problems/models/gpt-1t-256b.yaml"), "--system",
                                      str(ROOT / "problems/systems/h100-80g-nvl8.yaml"), "--gpus", "64",
                                      "--fix", "cp_comm=a2a", "--json"])
    assert result.exit_code == 0, result.output
    counted = json.loads(result.output)
    # only mappings with cp > 1 take a2a (with cp = 1 the flag is pinned to p2p)
    assert counted["by_dimension"]["cp_comm"] == {"a2a": counted["mappings"]} and counted["mappings"] > 0
    assert counted["by_dimension"]["cp"].get("1", 0) == 0


A2A_WINS = [c for c in CASES if c[0] in ("long-seq-tight-hbm", "131k-small-hbm-8gpu")]


@pytest.mark.parametrize("case", A2A_WINS, ids=[c[0] for c in A2A_WINS])
def test_solve_equals_brute_force_where_a2a_wins(case):
    _, model, system, gpus, max_batch, datatype, attention = case
    space, kernels = whole_group(get_space("full")), Kernels.with_attention(attention)
    _, reference = solve_equals_brute_force(model, system, gpus, max_batch, space, datatype, kernels)
    assert reference.best.mapping.context_par_comm is CPComm.a2a


CP_COMM_FREE = [c for c in CASES if c[0] in ("cp-with-tp-kv2", "131k-h100", "a100-unfused-core")]


@pytest.mark.parametrize("case", CP_COMM_FREE, ids=[c[0] for c in CP_COMM_FREE])
def test_solve_equals_brute_force_with_cp_comm_free(case):
    """The top three, certified, with every CP communication offered (kv2: a2a's heads rule
    binds at tp·cp > 2), as brute force ranks them."""
    _, model, system, gpus, max_batch, datatype, attention = case
    space, kernels = whole_group(get_space("full")), Kernels.with_attention(attention)
    _, reference = solve_equals_brute_force(model, system, gpus, max_batch, space, datatype, kernels, top_k=3)
    assert reference.best.mapping.cp > 1


def test_block_floors_never_exceed_an_exact_time_with_every_cp_comm():
    """The floors (minimised over cp_comm where cp > 1) sit at or below every feasible exact
    time of their blocks, a2a's heads rule and all_gather's buffers included (14 blocks, uneven
    stages and cp up to 16 on 16 GPUs)."""
    checked = assert_block_floors_below_exact(gqa(14, 2048, 16, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=24),
                                              16, 16, Datatype.bfloat16, whole_group(get_space("full")))
    assert any(sk.cp > 1 for sk in checked)


def test_pinned_cp_comm_solves_as_brute_force_on_the_same_pins():
    """`--fix cp_comm=all_gather`: the tables take all_gather alone where cp > 1 (and the K/V
    ring's mappings are out), and the certified answer is brute force's over the pinned space."""
    _, model, system, gpus, max_batch, datatype, attention = next(c for c in CASES if c[0] == "131k-small-hbm-8gpu")
    space, kernels = pinned(whole_group(get_space("full")), (("cp_comm", (1,)),)), Kernels.with_attention(attention)
    assert space.codes("cp_comm") == (1,)
    _, reference = solve_equals_brute_force(model, system, gpus, max_batch, space, datatype, kernels, top_k=2)
    assert reference.best.mapping.context_par_comm is CPComm.all_gather
