"""solver.space.flags.FlagTable holds a skeleton's flag table as the product of its leading and
trailing flags. The product is the table: row for row equal to the valid combinations found by
trying every combination of codes against the declared conditions (a plain loop here), and to
flag_combinations built in one pass over every flag; as long as the closed-form count. Its row
classes by any columns are the classes of the whole table's rows by those columns."""

import itertools

import numpy as np
import pytest

from costmodel.evaluate import STRUCTURE_DIMENSIONS, TIME_ONLY_DIMENSIONS
from costmodel.ops import distinct_rows
from costmodel.space.dimensions import skeleton_facts
from solver.space.count import count_flag_combinations
from solver.space.declaration import SPACES, coarse_facts
from solver.space.flags import _flag_table_cached, _trailing, flag_combinations
from solver.space.pins import pinned

SPLITS = [dict(tp=1, cp=1, ep=1, etp=1, pp=1, dp=4), dict(tp=2, cp=2, ep=2, etp=1, pp=2, dp=2),
          dict(tp=8, cp=1, ep=4, etp=2, pp=4, dp=8), dict(tp=1, cp=4, ep=1, etp=1, pp=1, dp=1)]
PINNED = pinned(SPACES["full"], (("recompute", (2,)), ("dp_net", (1,))))
TABLE_SPACES = {**SPACES, "full pinned": PINNED}


def _known(split: dict, offload: bool) -> tuple:
    return coarse_facts(skeleton_facts(split, offload))


def _tried_one_by_one(space, known: dict, num_networks: int) -> np.ndarray:
    """Every combination of the flags' codes kept where each flag takes a free code when its
    conditions hold and its first code otherwise (flag_combinations' rule), in lexicographic order."""
    domains = [dim.domain(num_networks, known) for dim in space.flags]
    kept = []
    for codes in itertools.product(*domains):
        values = {**known, **{dim.name: code for dim, code in zip(space.flags, codes)}}
        if all(space.admits(dim.name, code) and (code == domain[0] or all(c.holds(values) for c in dim.free_when))
               for dim, domain, code in zip(space.flags, domains, codes)):
            kept.append(codes)
    return np.array(kept, dtype=np.int32).reshape(len(kept), len(domains))


@pytest.mark.parametrize("name, split, offload", [("full", SPLITS[0], True), ("full pinned", SPLITS[1], True),
                                                  ("calculon-2023", SPLITS[1], False),
                                                  ("calculon-current", SPLITS[0], False)])
def test_the_product_is_every_valid_combination_tried_one_by_one(name, split, offload):
    space, known = TABLE_SPACES[name], _known(split, offload)
    table = _flag_table_cached(space, known, 1)
    np.testing.assert_array_equal(table.whole(), _tried_one_by_one(space, dict(known), 1))


@pytest.mark.parametrize("name", sorted(TABLE_SPACES))
@pytest.mark.parametrize("split, num_networks", [(split, 2) for split in SPLITS] + [(SPLITS[3], 3)])
def test_the_product_is_the_table_built_in_one_pass(name, split, num_networks):
    space, known = TABLE_SPACES[name], _known(split, True)
    table = _flag_table_cached(space, known, num_networks)
    whole = flag_combinations(space, dict(known), num_networks)
    np.testing.assert_array_equal(table.whole(), whole)
    assert len(table) == count_flag_combinations(space, known, num_networks)
    rows = np.random.default_rng(len(whole)).integers(0, max(len(whole), 1), 500 if len(whole) else 0)
    for j, codes in enumerate(table.columns(rows)):
        np.testing.assert_array_equal(codes, whole[rows, j])


def test_the_trailing_flags_read_no_leading_one():
    full = SPACES["full"]
    names = [dim.name for dim in full.flags]
    split = _trailing(full)
    assert names[split:] == ["optimizer_offload", "sched", "tp_net", "cp_net", "ep_net", "etp_net", "pp_net", "dp_net"]
    assert names[split - 1] == "activations_offload"            # (it reads recompute)
    for dim in full.flags[split:]:
        assert not {c.subject for c in dim.free_when} & set(names[:split])


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("read", ["memory", "structure", "none", "every"])
def test_row_classes_are_the_whole_tables_classes(split, read):
    space = SPACES["full"]
    table = _flag_table_cached(space, _known(split, True), 2)
    names = [dim.name for dim in space.flags]
    columns = tuple(j for j, name in enumerate(names) if {
        "memory": name not in TIME_ONLY_DIMENSIONS, "structure": name in STRUCTURE_DIMENSIONS,
        "none": False, "every": True}[read])
    classes, whole = table.classes(columns), table.whole()
    rows = np.arange(len(table))
    each = classes.of(rows)
    np.testing.assert_array_equal(classes.at(np.arange(len(classes.first))), each)
    np.testing.assert_array_equal(each[classes.first], np.arange(len(classes.first)))
    if columns:                   # the same partition as the whole table's distinct rows
        first, inverse, _ = distinct_rows([whole[:, j] for j in columns])
        assert len(first) == len(classes.first)
        pairs = set(zip(each.tolist(), inverse.tolist()))
        assert len(pairs) == len(first)
    else:
        assert len(classes.first) == 1
    assert table.classes(columns) is classes        # found once per table
