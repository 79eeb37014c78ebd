"""Adding a degree of parallelism touches its declaration only.

A copy of the sources gets one more degree, `xp`, declared in costmodel/space/dimensions.py and
nowhere else: its `Degree` (a group of xp GPUs folded into a stage, as etp is), its `split`
dimension (values 1 and 2, read by no cost term) and its network flag. Run in a subprocess on
that copy, every part that walks the declaration must take it in: the skeletons, the closed
form count, the enumeration, the CP-SAT model (its solution count) and the certified search,
which must still equal brute force.

The expected count is independent of the copy: the same problem on the real sources, times
(1 + networks) — each mapping once with xp = 1 (xp_net pinned) and once per network with
xp = 2 (its network free: the count leaves network sizes to the feasibility check). With no
cost term reading xp, the best time must not move.

Two more probes: `xq`, a factor of the GPU count (in the chain tp·cp·xq·pp·dp = N, so dp, the
count and every table that derives dp from CHAIN must take it in), and `xr`, a folded degree
that one cost term reads (the optimizer step splits its dense parameters xr ways): each touches
the declaration, and `xr` its term, nothing else. The declaration's effects (`touches`) are
checked against the hand lists they replaced.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = (
    ('    Degree("pp", "pp_net", ("tp", "cp", "pp")),',
     '    Degree("xp", "xp_net", ("xp",)),\n    Degree("pp", "pp_net", ("tp", "cp", "pp")),'),
    ('    Dimension("pp", "pipeline_par", "split",',
     '    Dimension("xp", "probe_par", "split", "a probe degree, read by no cost term", rule="1 or 2",\n'
     '              fits=lambda model, system, v: None if v["xp"] in (1, 2) else "probe_par: 1 or 2",\n'
     '              bound=limits.GPUS_SEARCH, default=1, touches=frozenset({MEMORY, NETWORK_CHECK})),\n'
     '    Dimension("pp", "pipeline_par", "split",'),
    ('    Dimension("pp_net", "pipeline_par_net", "network",',
     '    Dimension("xp_net", "probe_par_net", "network", "network index carrying the probe group",\n'
     '              free_when=(Condition("xp", ">", 1),), fits=_network_exists("xp_net"),\n'
     '              bound=limits.NETWORK_INDEX, touches=frozenset({TIME_ONLY, NETWORK_CHECK})),\n'
     '    Dimension("pp_net", "pipeline_par_net", "network",'),
)


def _probe(name: str, span: str, meaning: str) -> tuple[tuple[str, str], ...]:
    """The declaration of a probe degree `name` (values 1 or 2) and its network flag, before pp."""
    return (
        ('    Degree("pp", "pp_net", ("tp", "cp", "pp")),',
         f'    Degree("{name}", "{name}_net", {span}),\n    Degree("pp", "pp_net", ("tp", "cp", "pp")),'),
        ('    Dimension("pp", "pipeline_par", "split",',
         f'    Dimension("{name}", "probe_{name}", "split", "{meaning}", rule="1 or 2",\n'
         f'              fits=lambda model, system, v: None if v["{name}"] in (1, 2) else "probe_{name}: 1 or 2",\n'
         '              bound=limits.GPUS_SEARCH, default=1, touches=frozenset({MEMORY, NETWORK_CHECK})),\n'
         '    Dimension("pp", "pipeline_par", "split",'),
        ('    Dimension("pp_net", "pipeline_par_net", "network",',
         f'    Dimension("{name}_net", "probe_{name}_net", "network", "network index carrying the probe group",\n'
         f'              free_when=(Condition("{name}", ">", 1),), fits=_network_exists("{name}_net"),\n'
         '              bound=limits.NETWORK_INDEX, touches=frozenset({TIME_ONLY, NETWORK_CHECK})),\n'
         '    Dimension("pp_net", "pipeline_par_net", "network",'),
    )


CHAIN_PROBE = (
    *_probe("xq", '("tp", "cp", "xq")', "a probe degree in the chain, read by no cost term"),
    ('    Degree("dp", "dp_net", ("tp", "cp", "pp", "dp"), in_split=False),',
     '    Degree("dp", "dp_net", ("tp", "cp", "xq", "pp", "dp"), in_split=False),'),
)
"""xq: a factor of the GPU count, between cp and pp in the chain (dp = N/(tp·cp·xq·pp))."""

READ_PROBE = _probe("xr", '("xr",)', "a probe degree the optimizer step reads")
READ_TERM = (
    "costmodel/terms/data_parallel.py",
    "    opt_params = (params.dense / xp.where(sh.optimizer, sh.shard, 1.0)",
    "    opt_params = (params.dense / m.xr / xp.where(sh.optimizer, sh.shard, 1.0)",
)
"""xr's one cost term: the optimizer step updates 1/xr of the dense parameters on each GPU."""

CHECK = r"""
import dataclasses, json
import numpy as np
from ortools.sat.python import cp_model
from costmodel.space.choices import CPComm
from costmodel.space.dimensions import BY_NAME, SPLIT_DEGREES
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.search.brute import scan
from solver.search.cpsat.constraints import STRUCTURE, Problem
from solver.search.cpsat.variables import Variables
from solver.search.solve import SolverConfig, solve
from solver.space.count import count_mappings
from solver.space.declaration import get_space, skeletons
from solver.space.enumerate import enumerate_all

# (networks of 4 and 16 GPUs: every group of 4 GPUs fits either, so the CP-SAT model's network
# check, which the closed form leaves to feasibility, removes nothing from its count)
model = Model(name="probe", hidden=512, feedforward=2048, seq_size=256, attn_heads=8, attn_size=64, num_blocks=4)
networks = [dict(name=f"net{i}", size=4 * 4**i, bandwidth_gbps=100.0 * 4**-i, efficiency=0.8, latency_us=1.0,
                 processor_usage=0.1) for i in range(2)]
system = System.model_validate(dict(
    name="probe", compute={"bfloat16": dict(matrix_tflops=100.0, vector_tflops=10.0, matrix_efficiency=[[0, 1.0]],
                                            vector_efficiency=[[0, 1.0]])},
    hbm=dict(capacity_gib=80, bandwidth_gbps=2000), networks=networks))
full = get_space("full")
space = dataclasses.replace(full, offered=full.offered + (
    ("cp_comm", (BY_NAME["cp_comm"].code_of(CPComm.p2p),)), ("shard", (0,)), ("zero", (0, 1))))
gpus, cap = 4, 2


class Count(cp_model.CpSolverSolutionCallback):
    n = 0

    def on_solution_callback(self):
        self.n += 1


m = cp_model.CpModel()
v = Variables(m, space, skeletons(model, gpus, cap, space), gpus, len(system.networks))
for constraint in STRUCTURE:
    constraint.add(m, v, Problem(model, system, gpus, cap, space))
solver = cp_model.CpSolver()
solver.parameters.enumerate_all_solutions = True
solver.parameters.num_workers = 1
counter = Count()
solver.Solve(m, counter)
best = solve(model, system, gpus, max_batch=cap, datatype=Datatype.bfloat16, space=space, kernels=Kernels(),
             config=SolverConfig(top_k=1, workers=1))
brute = scan(model, system, gpus, cap, space, Datatype.bfloat16, Kernels(), top_k=1, workers=1)
print(json.dumps({
    "split_degrees": list(SPLIT_DEGREES), "count": count_mappings(model, system, gpus, cap, space).mappings,
    "enumerated": len(enumerate_all(model, system, gpus, cap, space)), "cp_sat": counter.n,
    "certified": best.certified_optimal, "best_s": best.best.iteration_time_s,
    "brute_best_s": brute.best.iteration_time_s, "same_best": best.best.mapping == brute.best.mapping,
    "xp_values": sorted({int(x) for x in enumerate_all(model, system, gpus, cap, space).columns.get(
        "xp", [1])}),
    "per_value": {name: {str(x): int(n) for x, n in zip(*np.unique(column, return_counts=True))}
                  for name, column in enumerate_all(model, system, gpus, cap, space).columns.items()
                  if name in ("xq", "xr")},
    "best_split": {name: int(best.best.mapping.value(name)) for name in SPLIT_DEGREES},
    "best_dp": int(best.best.mapping.value("dp")),
}))
"""


def _run(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=root, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _copy(tmp_path_factory, name: str, edits: dict[str, tuple[tuple[str, str], ...]]) -> Path:
    """A copy of costmodel/ and solver/ with `edits` (path -> (old, new) replacements) made."""
    root = tmp_path_factory.mktemp(name)
    for package in ("costmodel", "solver"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for relative, replacements in edits.items():
        path = root / relative
        text = path.read_text()
        for old, new in replacements:
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        path.write_text(text)
    return root


DECLARATION = "costmodel/space/dimensions.py"


@pytest.fixture(scope="module")
def before() -> dict:
    return _run(ROOT)


@pytest.fixture(scope="module")
def probe_root(tmp_path_factory) -> Path:
    """A copy of costmodel/ and solver/ whose declaration alone has the probe degree."""
    return _copy(tmp_path_factory, "probe", {DECLARATION: PROBE})


def test_a_degree_declared_alone_reaches_the_count_the_enumeration_cp_sat_and_the_search(probe_root, before):
    after = _run(probe_root)
    assert "xp" not in before["split_degrees"] and "xp" in after["split_degrees"]
    assert after["xp_values"] == [1, 2]
    assert before["count"] == before["enumerated"] == before["cp_sat"] > 0
    assert after["count"] == after["enumerated"] == after["cp_sat"] == before["count"] * (1 + 2)
    assert after["certified"] and after["same_best"]
    assert after["best_s"] == pytest.approx(after["brute_best_s"], rel=1e-9)
    assert after["best_s"] == pytest.approx(before["best_s"], rel=1e-9)


@pytest.mark.slow
def test_a_degree_in_the_chain_divides_the_gpus_and_the_search_follows(tmp_path_factory, before):
    """xq is a factor of N: with xq = 1 the mappings are today's; with xq = 2 each group of the
    chain outside it (pp, dp) sees half the GPUs. Count, enumeration and CP-SAT agree, dp is
    N/(tp·cp·xq·pp) everywhere, and the certified search equals brute force."""
    after = _run(_copy(tmp_path_factory, "chain", {DECLARATION: CHAIN_PROBE}))
    assert after["split_degrees"].index("xq") < after["split_degrees"].index("pp")
    assert after["count"] == after["enumerated"] == after["cp_sat"] > before["count"]
    assert after["per_value"]["xq"]["1"] == before["count"] and after["per_value"]["xq"]["2"] > 0
    assert after["certified"] and after["same_best"]
    assert after["best_s"] == pytest.approx(after["brute_best_s"], rel=1e-9)
    split = after["best_split"]
    assert split["tp"] * split["cp"] * split["xq"] * split["pp"] * after["best_dp"] == 4


@pytest.mark.slow
def test_a_degree_a_cost_term_reads_touches_the_declaration_and_that_term(tmp_path_factory, before):
    """xr halves the optimizer step's dense share at xr = 2, nothing else: the search must
    find it (the surrogate's tables read the term through the split), certified and equal to
    brute force, and strictly faster than today's best."""
    after = _run(_copy(tmp_path_factory, "read", {DECLARATION: READ_PROBE, READ_TERM[0]: (READ_TERM[1:],)}))
    assert after["count"] == after["enumerated"] == after["cp_sat"] == before["count"] * (1 + 2)
    assert after["certified"] and after["same_best"]
    assert after["best_s"] == pytest.approx(after["brute_best_s"], rel=1e-9)
    assert after["best_split"]["xr"] == 2 and after["best_s"] < before["best_s"]


def test_the_lists_of_what_dimensions_touch_derive_from_the_declaration(monkeypatch):
    """The hand lists the declaration's `touches` replaced, literally as they were written."""
    import dataclasses

    import numpy as np

    import costmodel.space.dimensions as dimensions
    from costmodel.evaluate import BLOCK_DIMENSIONS, STRUCTURE_DIMENSIONS, TIME_ONLY_DIMENSIONS
    from solver.search.cpsat.block_tables import BLOCK_FLAGS, GRID_NETWORKS

    nets = ("tp_net", "cp_net", "ep_net", "etp_net", "pp_net", "dp_net")
    assert BLOCK_DIMENSIONS == ("tp", "cp", "ep", "etp", "pp", "microbatch", "recompute", "tp_comm", "tp_overlap",
                                "cp_comm", "seq_par_ag_redo", "weight_offload", "activations_offload", *nets[:4])
    assert TIME_ONLY_DIMENSIONS == ("tp_overlap", "dp_overlap", *nets)
    assert STRUCTURE_DIMENSIONS == ("tp", "cp", "ep", "etp", "pp", "dp", "cp_comm", *nets)
    assert BLOCK_FLAGS == ("tp_comm", "seq_par_ag_redo", "recompute", "weight_offload", "activations_offload")
    assert GRID_NETWORKS == {"tp": "tp_net", "cp": "cp_net"}
    # dp = N/(tp·cp·pp), for whole numbers and for the tables' float grids
    tp, cp, pp = np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 1.0]), np.array([8.0, 1.0, 2.0])
    assert dimensions.data_parallel(64, {"tp": 2, "cp": 2, "pp": 4, "ep": 8}) == 4
    grid = dimensions.data_parallel(64, {"tp": tp, "cp": cp, "pp": pp})
    assert grid.dtype == np.int64 and grid.tolist() == [8, 16, 8]
    # a dimension that says neither memory nor time only, or a degree its network check skips, fails
    declared = dimensions.DIMENSIONS
    for name, touches in (("zero", frozenset()), ("pp_net", frozenset({dimensions.TIME_ONLY}))):
        changed = tuple(dataclasses.replace(d, touches=touches) if d.name == name else d for d in declared)
        monkeypatch.setattr(dimensions, "DIMENSIONS", changed)
        monkeypatch.setattr(dimensions, "BY_NAME", {d.name: d for d in changed})
        with pytest.raises(ValueError, match=name):
            dimensions._check_declaration()
