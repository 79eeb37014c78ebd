"""The paper's Figure 2 finding, solved from the shipped batch file: a model whose block
count is a power of two maps in far more ways, and trains faster, than one of 2 × 127 blocks.

Isaev, McDonald, Vuduc (2023), "Scaling Infrastructure to Support Multi-Trillion Parameter
LLM Training", Fig. 2: 15,612,832 vs 842,080 mappings on 4,096 H100s; MFU 75% vs 54% (1.39×).
"""

from __future__ import annotations

from conftest import PROBLEMS
from solver.batch import load_batch
from solver.runner import solve_payload

FIG2 = PROBLEMS / "paper" / "fig2-mappability.yaml"
PAPER_SETTING = "__fp8__calculon-2023__off512g100"   # the paper's system: 512 GiB @ 100 GB/s


def test_fig2_power_of_two_blocks_win_in_the_papers_setting():
    problems = {p.model.num_blocks: p for p in load_batch(FIG2) if p.id.endswith(PAPER_SETTING)}
    assert sorted(problems) == [254, 256]
    results = {blocks: solve_payload(p.payload()) for blocks, p in problems.items()}
    assert all(r["status"] == "optimal" and r["certified_optimal"] for r in results.values())
    # The counts are exact (the brief checked the enumeration against the published ones).
    assert results[256]["mappings"] == 15_612_832 and results[254]["mappings"] == 842_080
    mfu = {blocks: r["best"]["mfu"] for blocks, r in results.items()}
    # The acceptance: the 256-block model wins by at least 1.2× MFU (paper: 1.39×).
    assert mfu[256] / mfu[254] >= 1.2
    # And the winner is near the paper's 75%: within 10 points (our H100 efficiencies top out
    # at 78% of peak for the largest GEMMs, so MFU cannot reach the paper's figure exactly).
    assert abs(mfu[256] - 0.75) <= 0.10
    # Why: 254 = 2 × 127 allows pipelines of depth 1 or 2 only on 4,096 GPUs, which must
    # stream weights from offload memory; 256 blocks pipeline deeper.
    assert results[254]["best"]["mapping"]["pipeline_par"] <= 2 < results[256]["best"]["mapping"]["pipeline_par"]
