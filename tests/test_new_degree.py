"""Adding a degree of parallelism touches its declaration only.

A copy of the sources gets one more degree, `xp`, declared in costmodel/dimensions.py and
nowhere else: its `Degree` (a group of xp GPUs folded into a stage, as etp is), its `split`
dimension (values 1 and 2, read by no cost term) and its network flag. Run in a subprocess on
that copy, every part that walks the declaration must take it in: the skeletons, the closed
form count, the enumeration, the CP-SAT model (its solution count) and the certified search,
which must still equal brute force.

The expected count is independent of the copy: the same problem on the real sources, times
(1 + networks) — each mapping once with xp = 1 (xp_net pinned) and once per network with
xp = 2 (its network free: the count leaves network sizes to the feasibility check). With no
cost term reading xp, the best time must not move.
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
     '              bound=limits.GPUS_SEARCH, default=1),\n'
     '    Dimension("pp", "pipeline_par", "split",'),
    ('    Dimension("pp_net", "pipeline_par_net", "network",',
     '    Dimension("xp_net", "probe_par_net", "network", "network index carrying the probe group",\n'
     '              free_when=(Condition("xp", ">", 1),), fits=_network_exists("xp_net"),\n'
     '              bound=limits.NETWORK_INDEX),\n'
     '    Dimension("pp_net", "pipeline_par_net", "network",'),
)

CHECK = r"""
import dataclasses, json
from ortools.sat.python import cp_model
from costmodel.choices import CPComm
from costmodel.dimensions import BY_NAME, SPLIT_DEGREES
from costmodel.kernels import Kernels
from costmodel.model import Model
from costmodel.system import Datatype, System
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
}))
"""


def _run(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=root, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probe_root(tmp_path_factory) -> Path:
    """A copy of costmodel/ and solver/ whose declaration alone has the probe degree."""
    root = tmp_path_factory.mktemp("probe")
    for package in ("costmodel", "solver"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "costmodel" / "dimensions.py"
    text = path.read_text()
    for old, new in PROBE:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)
    return root


def test_a_degree_declared_alone_reaches_the_count_the_enumeration_cp_sat_and_the_search(probe_root):
    before, after = _run(ROOT), _run(probe_root)
    assert "xp" not in before["split_degrees"] and "xp" in after["split_degrees"]
    assert after["xp_values"] == [1, 2]
    assert before["count"] == before["enumerated"] == before["cp_sat"] > 0
    assert after["count"] == after["enumerated"] == after["cp_sat"] == before["count"] * (1 + 2)
    assert after["certified"] and after["same_best"]
    assert after["best_s"] == pytest.approx(after["brute_best_s"], rel=1e-9)
    assert after["best_s"] == pytest.approx(before["best_s"], rel=1e-9)
