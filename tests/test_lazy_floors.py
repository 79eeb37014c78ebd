"""The engine's block floors computed a skeleton at a time as its ranking is read
(solver.search.cpsat.lazy_floors.LazyFloors) equal block_lower_bounds computed at once: the
ranking in the same order as sorting every finite floor, read whole or in part and then again,
the whole dict the same, and each skeleton's time bound no more than any floor of its blocks,
on small spaces (with offload, with FP8, with blocks of several kinds) and on DeepSeek-V3 with
its layouts fixed."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_model
from costmodel.inputs.system import Datatype
from solver.search.cpsat.block_floors import FloorChoices, GroupRows, block_lower_bounds, ranking, skeleton_times
from solver.search.cpsat.lazy_floors import LazyFloors
from solver.search.engine import Engine
from solver.space.declaration import get_space
from solver.space.pins import pinned

from tests.test_pinned_floors import CASES, H100

ROOT = Path(__file__).resolve().parents[1]
DEEPSEEK = load_model(ROOT / "problems/models/deepseek-v3/config.json", seq_size=4096)
CASES = [*CASES, ("deepseek-v3-pp16", DEEPSEEK, H100, 2048, 3072, Datatype.bfloat16, "full")]


def _engine(case) -> Engine:
    _, model, system, gpus, cap, datatype, space_name = case
    space = get_space(space_name)
    if case[0] == "deepseek-v3-pp16":
        space = pinned(space, (("pp", (16,)), ("ep", (64,)), ("tp", (1,))))
    return Engine(model, system, gpus, cap, datatype, space, Kernels())


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_lazy_floors_equal_the_floors_computed_at_once(case):
    engine = _engine(case)
    c, space, skeletons = engine.c, engine.plan.space, engine.plan.skeletons
    expected = block_lower_bounds(engine.tables, c, space, skeletons, engine.local_batch,
                                  c.memory.offload_capacity_bytes > 0, len(engine.problem.system.networks),
                                  c.memory.hbm_capacity_bytes)
    lazy = LazyFloors(engine.tables, c, space, skeletons, engine.local_batch, len(engine.problem.system.networks))
    head = list(itertools.islice(lazy.ranked, 5))              # a part first, as a search reads it
    everything = ranking(expected)
    assert len(everything) > 5 and head == everything[:5]
    assert 0 < len(lazy._computed) < len(skeletons)            # read in part: not every skeleton computed
    assert list(lazy.ranked) == everything                     # then whole, from the start
    floors = lazy.all()
    assert list(floors) == list(expected) and floors == expected
    assert engine.block_floors == expected                     # the engine's own


@pytest.mark.parametrize("case", CASES[:3], ids=[case[0] for case in CASES[:3]])
def test_a_skeletons_time_bound_is_at_most_each_floor_of_its_blocks(case):
    engine = _engine(case)
    c, space = engine.c, engine.plan.space
    has_offload, networks = c.memory.offload_capacity_bytes > 0, len(engine.problem.system.networks)
    choices = FloorChoices.of(space, has_offload, networks)
    rows = GroupRows(engine.tables, choices.combos)
    floors = engine.block_floors
    checked = 0
    for sk in engine.plan.skeletons:
        timed = skeleton_times(engine.tables, c, choices, rows, sk, engine.local_batch[sk.split], has_offload)
        own = [floor for key, floor in floors.items() if key.split == sk.split]
        if timed is None:
            assert all(floor == float("inf") for floor in own)
            continue
        assert timed.least_time() <= min(own)
        checked += 1
    assert checked > 10
