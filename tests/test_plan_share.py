"""What `mapsat plan` shares across GPU counts changes no answer: a plan over several counts
equals one independent `solve` per count and phase (the same certified best time to 1e-12
and the same mapping), with the shared tables cold, warm, and warmed by other counts; the
shared (tp, cp, ep, etp, microbatch) tables equal the ones a single count builds; and the CP-SAT
model, built only when the block floors cannot prove the answer, gives the same answer when
it is built."""

from __future__ import annotations

import pytest
from conftest import REPO, plain
from test_expert_parallel import moe

from costmodel.space.dimensions import GROUP_DEGREES
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from costmodel.terms.training_cost import LLAMA3_FAILURE_RATE_PER_GPU_HOUR
from solver.search.engine import CountShare, Engine, Question
from solver.search.plan import Phase, Settings, phase_model, plan
from solver.search.solve import SolverConfig, solve
from solver.space.declaration import get_space
from solver.space.pins import pinned

H100 = load_system(REPO / "problems/systems/h100-80g-nvl8.yaml")
SMALL = Model(name="small", hidden=1024, feedforward=4096, seq_size=2048, attn_heads=16, attn_size=64, num_blocks=8)
SETTINGS = Settings(LLAMA3_FAILURE_RATE_PER_GPU_HOUR, 2000.0, False, 48.0, 10.0)
COUNTS = [4, 8, 16, 32]
# two sequence lengths (two contexts in one share), a fixed and a capped batch
PHASES = [Phase(name="short", tokens=1e9, seq_size=2048, batch=64), Phase(name="long", tokens=1e9, seq_size=4096)]
MAX_BATCH = 48
PLAIN = plain(get_space("full"))
"""The plans and solves compared: `full` as before cp_comm and hybrid sharding (the shared
tables with both are test_shared_block_tables_equal_a_single_counts[dense]'s)."""


def _alone(n: int, phase: Phase):
    """`solve` at one count and phase, nothing shared: what a user gets from `mapsat solve`."""
    batch = phase.batch_sequences
    space = PLAIN if batch is None else pinned(PLAIN, (("batch", (batch,)),))
    return solve(phase_model(SMALL, phase), H100, n, max_batch=batch or MAX_BATCH, space=space,
                 config=SolverConfig(top_k=1))


@pytest.fixture(scope="module")
def alone() -> dict:
    return {(n, p.name): _alone(n, p) for n in COUNTS for p in PHASES}


def _check_equal(result, alone: dict) -> None:
    assert [row.num_gpus for row in result.counts] == COUNTS
    for row in result.counts:
        assert row.feasible, row.reason
        for phase_plan in row.phases:
            shared, ref = phase_plan.result, alone[(row.num_gpus, phase_plan.phase.name)]
            assert shared.certified_optimal and ref.certified_optimal
            assert shared.best.iteration_time_s == pytest.approx(ref.best.iteration_time_s, rel=1e-12, abs=0)
            assert shared.best.mapping == ref.best.mapping, (row.num_gpus, phase_plan.phase.name)


def test_plan_equals_independent_solves_cold_and_warm(alone):
    share = CountShare()
    cold = plan(SMALL, H100, COUNTS, PHASES, SETTINGS, max_batch=MAX_BATCH, space=PLAIN, share=share)
    _check_equal(cold, alone)
    # warm: every context and table already built by the cold plan
    warm = plan(SMALL, H100, COUNTS, PHASES, SETTINGS, max_batch=MAX_BATCH, space=PLAIN, share=share)
    _check_equal(warm, alone)


def test_plan_equals_independent_solves_with_tables_built_by_other_counts(alone):
    """The share warmed by counts in another order (and a count not in the list), so each
    count finds its groups computed alongside others' in another grid."""
    share = CountShare()
    plan(SMALL, H100, [64, 2], PHASES, SETTINGS, max_batch=MAX_BATCH, space=PLAIN, share=share)
    for n in reversed(COUNTS):
        plan(SMALL, H100, [n], PHASES, SETTINGS, max_batch=MAX_BATCH, space=PLAIN, share=share)
    _check_equal(plan(SMALL, H100, COUNTS, PHASES, SETTINGS, max_batch=MAX_BATCH, space=PLAIN,
                      share=share), alone)


def _engine(n: int, share: CountShare | None = None, model: Model = SMALL, space=None) -> Engine:
    return Engine(model, H100, n, 64, Datatype.bfloat16, space or get_space("full"), Kernels(), one_question=True,
                  share=share)


# an MoE model (8 experts of 1024, top 2): its groups carry ep and etp, and each group's EP and
# ETP networks are chosen from that group alone (tables.best_expert_networks)
MOE = moe()


# the dense model in `full` (cp_comm's axis in the cp > 1 groups, shard groups in the DP table);
# the MoE model as before cp_comm and hybrid sharding (its cp > 1 groups would come three times)
@pytest.mark.parametrize("model, flags", [(SMALL, "all"), (MOE, "plain")], ids=["dense", "moe"])
def test_shared_block_tables_equal_a_single_counts(model, flags):
    share = CountShare()
    space = plain(get_space("full")) if flags == "plain" else get_space("full")
    for n in (32, 4, 16):              # fill the cache from other counts first
        _engine(n, share, model, space)
    shared, fresh = _engine(8, share, model, space), _engine(8, model=model, space=space)
    if model is MOE:                   # groups with ep > 1 and etp other than tp are among them
        groups = [dict(zip(GROUP_DEGREES, key)) for key in fresh.tables.tm_keys]
        assert any(g["ep"] > 1 for g in groups) and any(g["etp"] != g["tp"] for g in groups)
    for name in ("block", "block_zb", "stored", "workspace"):
        for combo, table in getattr(fresh.tables, name).items():
            assert {k: getattr(shared.tables, name)[combo][k] for k in table} == table, (name, combo)
    for name in ("compute", "head", "p2p"):
        table = getattr(fresh.tables, name)
        assert {k: getattr(shared.tables, name)[k] for k in table} == table, name
    assert shared.block_floors == fresh.block_floors


def test_the_cpsat_model_is_built_only_when_the_floors_cannot_prove():
    """With the default warm start the floors prove the answer (no CP-SAT model, no round);
    with no warm start they cannot, and the model built then finds the same answer."""
    proven = _engine(16, space=plain(get_space("full")))      # as before cp_comm and shard
    by_floors = proven.search(Question(top_k=3))
    assert by_floors.certified and by_floors.rounds == 0 and proven._cpsat is None
    lazy = _engine(16, space=plain(get_space("full")))
    by_cpsat = lazy.search(Question(top_k=3, warm_start_blocks=0))
    assert lazy._cpsat is not None and by_cpsat.rounds >= 1 and by_cpsat.certified
    assert by_cpsat.times_s == by_floors.times_s
    assert ([proven.mapping(*g[0]) for g in by_floors.groups] == [lazy.mapping(*g[0]) for g in by_cpsat.groups])
