"""Published findings, solved from the shipped batch files (problems/paper/): a model whose
block count is a power of two maps in far more ways, and trains faster, than one of 2 × 127
blocks (Figure 2); what offload memory adds to a 1T model (Figure 4); and that 128T needs
120 GiB of HBM (Figure 8).

Isaev, McDonald, Vuduc (2023), "Scaling Infrastructure to Support Multi-Trillion Parameter
LLM Training". Fig. 2: 15,612,832 vs 842,080 mappings on 4,096 H100s; MFU 75% vs 54% (1.39×).

The batches run on the papers' assumed H100 (problems/systems/h100-80g-nvl8-paper2023.yaml),
not the measured one: these tests check the reproduction, not today's hardware.
"""

from __future__ import annotations

import pytest

from conftest import PROBLEMS
from solver.study.batch import load_batch
from solver.study.runner import solve_payload

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
    # The README's figures (causal count): 65.8 % against 53.3 %, to their rounding; the paper's
    # 75 % against 54 % is not reached (the H100 paper file's GEMMs top out at 78 % of peak).
    assert mfu[256] == pytest.approx(0.658, abs=5e-4) and mfu[254] == pytest.approx(0.533, abs=5e-4)
    # Why: 254 = 2 × 127 allows pipelines of depth 1 or 2 only on 4,096 GPUs, which must
    # stream weights from offload memory; 256 blocks pipeline deeper.
    assert results[254]["best"]["mapping"]["pipeline_par"] <= 2 < results[256]["best"]["mapping"]["pipeline_par"]


def solved(batch: str, *suffixes: str) -> dict[str, dict]:
    """Solve the problems of a shipped paper batch whose ids end with the given suffixes."""
    problems = {p.id: p for p in load_batch(PROBLEMS / "paper" / batch)}
    out = {}
    for suffix in suffixes:
        (pid,) = [pid for pid in problems if pid.endswith(suffix)]
        out[suffix] = solve_payload(problems[pid].payload())
    return out


def test_fig4_1t_without_offload_and_what_offload_adds():
    # Paper: on 4,096 GPUs without offload the 1T model reaches only ~60% MFU; 1 TiB of offload
    # memory lifts it. Tolerance: 5 points around the paper's 60%.
    r = solved("fig4-offload.yaml", "gpt-1t-128b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__nooff",
               "gpt-1t-128b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__off1024g100")
    plain = r["gpt-1t-128b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__nooff"]["best"]["mfu"]
    offload = r["gpt-1t-128b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__off1024g100"]["best"]["mfu"]
    assert abs(plain - 0.60) <= 0.05
    assert offload >= plain + 0.10


def test_fig8_128t_needs_120_gib_of_hbm():
    # Paper: two blocks must fit in HBM, so 128T needs 120 GiB; with 2 TiB of offload it then
    # trains at > 75% MFU. Ours: infeasible at 80 GiB whatever the offload, and within 10
    # points of 75% at 120 GiB (the H100 file's 78% GEMM ceiling keeps it below).
    r = solved("fig8-128T.yaml", "gpt-128t-416b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__hbm80__off2048g100",
               "gpt-128t-416b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__hbm120__off2048g100")
    small = r["gpt-128t-416b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__hbm80__off2048g100"]
    large = r["gpt-128t-416b__h100-80g-nvl8-paper2023__g4096__fp8__calculon-current__hbm120__off2048g100"]
    assert small["status"] == "infeasible" and small["certified_optimal"]
    assert any(reason.startswith("hbm capacity") for reason in small["infeasible_reasons"])
    assert large["status"] == "optimal" and abs(large["best"]["mfu"] - 0.75) <= 0.10
