"""The block grid evaluates the offload switches off only on a system with no offload tier
(solver.search.cpsat.block_tables._offload_codes): its tables must equal, entry for entry, those
of the grid that evaluates both switches — on a dense model, a mixture-of-experts model with
kinds of blocks, and a layer pattern (Mamba-2, attention, MLP), with and without context
parallelism. With a tier, both switches are evaluated and their tables differ. Likewise the
sequence-parallel AG redo, evaluated on only where a mapping can take it (redo_grids)."""

from pathlib import Path

import numpy as np
import pytest

from costmodel.encoding import MappingArrays
from costmodel.evaluate import array_fields
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.system import Datatype
from costmodel.ops import ArrayOps
from costmodel.terms.block_memory import block_stored
from costmodel.terms.block_offload import offload_exposed, offload_traffic
from costmodel.terms.block_terms import kind_forward
from costmodel.terms.context import Context
from solver.search.cpsat import block_tables

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "problems/systems/h100-80g-nvl8.yaml"
CASES = [  # model, keys (tp, cp, ep, etp, microbatch), datatype
    ("gpt-1t-256b.yaml", [(8, 1, 1, 1, 1), (4, 1, 1, 1, 2), (2, 2, 1, 1, 1)], "float8"),
    ("deepseek-v3/config.json", [(1, 1, 8, 1, 1), (2, 1, 16, 1, 2), (4, 1, 64, 1, 1)], "bfloat16"),
    ("nemotron-h-8b/config.json", [(1, 1, 1, 1, 1), (2, 1, 1, 1, 2), (2, 2, 1, 1, 1)], "bfloat16"),
]


def _tables(c: Context, keys: list) -> dict:
    return block_tables._block_tables(c, keys, (0, 1, 2), len(c.net.size))


def _context(model_file: str, datatype: str, system=H100, seq: int = 4096) -> Context:
    model = load_model(ROOT / "problems/models" / model_file, seq_size=seq)
    mapping = Mapping(num_procs=8, tensor_par=1, pipeline_par=1, data_par=8, batch_size=8, microbatch_size=1,
                      datatype=datatype)
    return Context.build(model, system if not isinstance(system, Path) else load_system(system),
                         Datatype(datatype), mapping.kernels)


@pytest.mark.parametrize("model_file, keys, datatype", CASES)
def test_no_offload_tier_grid_equals_the_grid_of_both_switches(monkeypatch, model_file, keys, datatype):
    c = _context(model_file, datatype)
    assert c.memory.offload_bytes_per_s == 0
    assert block_tables._offload_codes(c) == [False]
    pruned = _tables(c, keys)
    monkeypatch.setattr(block_tables, "_offload_codes", lambda c: [False, True])
    assert pruned == _tables(c, keys)        # every table, key and value, exactly


def test_an_offload_tier_evaluates_both_switches_and_they_differ():
    system = load_system(H100).with_overrides(offload_gib=1024, offload_gbps=10)
    c = _context("gpt-1t-256b.yaml", "float8", system)
    assert block_tables._offload_codes(c) == [False, True]
    block = _tables(c, [(8, 1, 1, 1, 1)])["block"]    # keyed (tp_comm, redo, recompute, weight, activations)
    assert any(block[(*flags, 1, 1)] != block[(*flags, 0, 0)]   # 10 GB/s cannot hide the traffic
               for flags in {combo[:3] for combo in block})


def _free_combo(tp_comm: int, redo: int, recompute: int) -> bool:
    """Whether a mapping can take the AG redo `redo` with these codes (the declaration's rule)."""
    return not redo or (tp_comm == block_tables.TP_COMM_RS_AG and recompute != block_tables.RECOMPUTE_FULL)


@pytest.mark.parametrize("model_file, keys, datatype", CASES)
def test_redo_grids_equal_the_whole_product_wherever_a_mapping_can_be(monkeypatch, model_file, keys, datatype):
    """The block grid evaluates the sequence-parallel AG redo on only where the space lets it be on
    (block_tables.redo_grids: 11 of the 18 (tp_comm, redo, recompute) rows): at every flag combination
    a mapping can take, and in the tables minimised over every flag, its tables equal those of the
    whole product."""
    c = _context(model_file, datatype)
    system = load_system(H100).with_overrides(offload_gib=1024, offload_gbps=10)
    for context in (c, _context(model_file, datatype, system)):
        grids = block_tables.redo_grids(dict(tp_comm=[0, 1, 2], seq_par_ag_redo=[False, True],
                                             recompute=list(block_tables.RECOMPUTES)))
        assert [len(g["tp_comm"]) * len(g["recompute"]) for g in grids] == [9, 2]
        pruned = _tables(context, keys)
        monkeypatch.setattr(block_tables, "redo_grids", lambda axes: [axes])
        monkeypatch.setattr(block_tables, "with_redo", lambda off, *on: off.values)
        whole = _tables(context, keys)
        monkeypatch.undo()
        for name, table in whole.items():
            if isinstance(table, dict):
                combos = [k for k in table if (_free_combo(*k[:3]) if len(k) == 5 else
                                               k[1] != "sp_redo" or k[0] != block_tables.RECOMPUTE_FULL)]
                assert len(combos) in (11 * len(table) // 18, 8), name
                assert all(pruned[name][k] == table[k] for k in combos), name
            else:
                assert pruned[name] == table, name


@pytest.mark.parametrize("tier", [False, True], ids=["no-tier", "tier"])
def test_rows_offloading_nothing_take_no_offload_time_without_the_formula(tier):
    """block_offload.offload_exposed returns 0 for its three terms where no row has an offload
    switch on, without evaluating them: what the formulas give for 0 bytes of traffic
    (offload_traffic's), on a grid of rows with and without an offload tier."""
    system = load_system(H100).with_overrides(offload_gib=1024, offload_gbps=10) if tier else load_system(H100)
    c = _context("deepseek-v3/config.json", "bfloat16", system)
    rows = {**block_tables._DEFAULT_COLUMNS, "tp": np.array([1, 2, 4]), "ep": np.array([8, 16, 64]),
            "microbatch": np.array([1, 2, 1])}
    m = array_fields(MappingArrays.of(**{k: np.broadcast_to(np.asarray(v), (3,)) for k, v in rows.items()}))
    act = block_stored(c, m, ArrayOps, kind_forward(c, m, ArrayOps, "moe"))
    fwd_s, bwd_s = np.array([1e-3, 2e-3, 3e-3]), np.array([2e-3, 4e-3, 6e-3])
    assert offload_exposed(c, m, ArrayOps, "moe", act, fwd_s, bwd_s) == (0.0, 0.0, 0.0)
    off_fwd_bytes, off_bwd_bytes, off_fwd_s, off_bwd_s = offload_traffic(c, m, ArrayOps, "moe", act)
    assert not off_fwd_bytes.any() and not off_bwd_bytes.any()
    assert not np.maximum(off_fwd_s - fwd_s, 0.0).any() and not np.maximum(off_bwd_s - bwd_s, 0.0).any()
    if tier:                                    # a row offloading its weights: the formulas' own values
        on = array_fields(MappingArrays.of(**{k: np.broadcast_to(np.asarray(v), (3,))
                                              for k, v in {**rows, "weight_offload": True}.items()}))
        exposed = offload_exposed(c, on, ArrayOps, "moe", act, fwd_s, bwd_s)
        assert all(np.all(np.asarray(value) > 0) for value in exposed[2:])
