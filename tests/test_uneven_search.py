"""Uneven pipeline stages in the search: the space offers a pp that divides num_blocks + 2
(but not num_blocks) with lighter first and last stages, or else one whose last chunk is
short (costmodel.terms.pipeline), the Calculon presets do not, and
the solver's certified answer equals brute force where such a layout wins — by the exact
block floors alone, and with the CP-SAT path forced (no warm start, no floor proof), for
these problems and for context parallelism's."""

from __future__ import annotations

from pathlib import Path

import pytest

import solver.search.engine as engine_module
from costmodel.terms.context import Context
from costmodel.evaluate import evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from solver.search.cpsat.block_tables import SplitKeys
from solver.search.cpsat.tables import Tables
from solver.space.count import count_mappings
from solver.space.declaration import get_space, skeletons
from solver.space.pins import parse_pins, pinned
from conftest import assert_block_floors_below_exact, plain, solve_equals_brute_force
from tests.test_context_parallel import CASES as CP_CASES, gqa

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
A100 = load_system(ROOT / "problems/systems/a100-80g-selene.yaml")


def gpt(blocks: int, hidden: int, heads: int, seq: int) -> Model:
    return Model(name=f"m{blocks}", hidden=hidden, feedforward=4 * hidden, seq_size=seq, attn_heads=heads,
                 attn_size=hidden // heads, num_blocks=blocks)


def test_the_space_offers_uneven_pp_only_where_the_preset_allows():
    # 126 blocks (Llama 3.1 405B's count): 16 stages only as 7, 8 × 14, 7
    model = gqa(126, 2048, 16, 8, 2048, vocab=128256)
    full = {s.pp for s in skeletons(model, 256, 256, get_space("full"))}
    paper = {s.pp for s in skeletons(model, 256, 256, get_space("calculon-current"))}
    assert {16, 32, 64} <= full and paper == {1, 2}
    # interleaving divides the share (num_blocks + 2)/pp = 8 with pp 16
    sk = next(s for s in skeletons(model, 256, 256, get_space("full")) if s.pp == 16)
    assert sk.interleavings == (1, 2, 4, 8)
    assert count_mappings(model, H100, 256, 256, get_space("full")).by_dimension["pp"]["16"] > 0


CASES = [
    # (id, model, system, gpus, max_batch, datatype, pins) — the best mapping has uneven stages
    ("30-blocks-pp4-interleaved", gqa(30, 4096, 32, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=24), 32, 64,
     Datatype.bfloat16, ["zero=0,1", "cp=1", "tp=1", "shard=all"]),
    ("22-blocks-a100-fp16", gpt(22, 4096, 32, 2048), A100.with_overrides(hbm_gib=16), 16, 64, Datatype.float16,
     ["zero=0,1", "cp=1", "tp=1,2", "shard=all"]),
    ("6-blocks-zb-h1-one-block-ends", gqa(6, 8192, 64, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=40), 16, 32,
     Datatype.float8, ["pp=4,8", "cp_comm=p2p", "shard=all"]),
    ("62-blocks-pp8", gqa(62, 2048, 16, 4, 4096, vocab=128256), H100.with_overrides(hbm_gib=16), 32, 64, Datatype.bfloat16,
     ["zero=0", "cp=1", "tp=1"]),
    ("14-blocks-offload-fp8", gqa(14, 4096, 32, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=30, offload_gib=128,
                                                                              offload_gbps=50),
     16, 32, Datatype.float8, ["pp=4,8,16", "cp_comm=p2p", "shard=all"]),
    # a short last chunk (pp divides neither num_blocks nor num_blocks + 2): 13 blocks on pp 2
    # of 7 chunks (7 and 6), on pp 4 (4, 4, 4, 1); 7 blocks on pp 2 of 4 chunks (4 and 3)
    ("13-blocks-short-last-chunk-pp2-interleaved", gqa(13, 4096, 32, 8, 4096, vocab=128256),
     H100.with_overrides(hbm_gib=24), 16, 32, Datatype.bfloat16, ["zero=0,1", "cp=1", "tp=1", "shard=all"]),
    ("13-blocks-short-last-chunk-pp4", gqa(13, 4096, 32, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=16), 16,
     32, Datatype.bfloat16, ["zero=0,1", "cp=1", "tp=1", "shard=all"]),
    ("7-blocks-short-last-chunk", gqa(7, 4096, 32, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=40), 16, 32,
     Datatype.bfloat16, ["pp=2,4", "cp_comm=p2p", "shard=all"]),
]


def _check(model, system, gpus, max_batch, datatype, space, kernels=Kernels()):
    return solve_equals_brute_force(model, system, gpus, max_batch, space, datatype, kernels, top_k=3)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_solve_equals_brute_force_where_uneven_stages_win(case):
    _, model, system, gpus, max_batch, datatype, pins = case
    _, reference = _check(model, system, gpus, max_batch, datatype, pinned(get_space("full"), parse_pins(pins)))
    assert model.num_blocks % reference.best.mapping.pp != 0          # the answer is an uneven layout


# the whole group only (as before hybrid sharding); context parallelism's first three problems
# with the K/V ring only, but for 131k-small-hbm-8gpu, where a2a wins with every cp_comm offered
FORCED = [c for c in CASES if c[0] in ("30-blocks-pp4-interleaved", "6-blocks-zb-h1-one-block-ends",
                                       "7-blocks-short-last-chunk", "13-blocks-short-last-chunk-pp4")] + [
    (c[0], c[1], c[2], c[3], c[4], c[5], ["shard=all"] if c[0] == "131k-small-hbm-8gpu" else ["cp_comm=p2p", "shard=all"]) for c in CP_CASES[:3]]


@pytest.mark.parametrize("case", FORCED, ids=[c[0] for c in FORCED])
def test_the_cp_sat_path_alone_certifies_the_same_answer(case, monkeypatch):
    """No warm start and no proof from the block floors: CP-SAT's rounds over the
    surrogate (its uneven-stage and context-parallel bounds) must reach the same optimum."""
    monkeypatch.setattr(engine_module, "WARM_START_BLOCKS", 0)
    monkeypatch.setattr(engine_module, "floors_prove", lambda *args: False)
    _, model, system, gpus, max_batch, datatype, pins = case
    result, _ = _check(model, system, gpus, max_batch, datatype, pinned(get_space("full"), parse_pins(pins)))
    assert result.rounds > 0


@pytest.mark.parametrize("model, system, gpus", [
    (gqa(14, 2048, 16, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=24), 16),
    (gqa(6, 4096, 32, 8, 8192, vocab=128256), H100.with_overrides(hbm_gib=40, offload_gib=64, offload_gbps=50), 16),
    (gqa(13, 2048, 16, 8, 4096, vocab=128256), H100.with_overrides(hbm_gib=24), 16),
])
def test_block_floors_never_exceed_an_exact_time_in_their_block_with_uneven_stages(model, system, gpus):
    """The floors certify and cut blocks: each must sit at or below every feasible exact time
    of its block, uneven layouts (pp 4 and 8 of 14 blocks, pp 4 and 8 of 6) and cp included."""
    # as before cp_comm and shard: the floors with every cp_comm are tests/test_cp_comm.py's
    checked = assert_block_floors_below_exact(model, system, gpus, 64, Datatype.bfloat16, plain(get_space("full")))
    assert len(checked) > 10 and any(model.num_blocks % sk.pp for sk in checked)


def test_stage_tables_sit_below_every_interleavings_layout():
    """A short last chunk moves the end stages' blocks with the interleaving (13 blocks on pp 2:
    7 and 6 at v = 1, 8 and 5 at v = 2): where two MTP modules make the last stage the fullest,
    v = 1's optimizer step is the longer, so the stage tables must take the least over the
    layouts to stay below each one's exact terms."""
    model = gqa(13, 1024, 8, 8, 4096, vocab=128256).model_copy(update={"mtp_blocks": 2})
    space = plain(get_space("full"))
    sks = [s for s in skeletons(model, 16, 64, space) if s.pp == 2 and s.tp == s.cp == 1]
    c = Context.build(model, H100, Datatype.bfloat16, Kernels())
    tables = Tables(c, SplitKeys(sks), 16, space, len(c.net.size))
    optimizer = {}
    for sk in sks:
        for il in sk.interleavings:
            mapping = Mapping(num_procs=16, tensor_par=1, pipeline_par=2, data_par=sk.dp, batch_size=sk.batch,
                              microbatch_size=sk.microbatches[0], pipeline_interleaving=il, tensor_par_net=0,
                              pipeline_par_net=1, data_par_net=1)
            optimizer[il] = evaluate(model, H100, mapping).time.optimizer_s
            assert tables.optimizer[0][sk.split] <= optimizer[il] * (1 + 1e-12), il
    assert optimizer[1] > optimizer[2]          # the case the least over the layouts is for
