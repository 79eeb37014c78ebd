"""The chosen mappings drawn: for each problem of a batch, its best mapping's iteration time
split into the cost model's terms (stacked bars, in shares of the iteration so problems of
any size compare), labelled with the mapping itself and its iteration time."""

from __future__ import annotations

from pathlib import Path

from costmodel.terms.iteration import TIME_TERMS
from solver.report.figure import pyplot, save

TERM_LABELS = {"forward_s": "forward", "backward_s": "backward", "recompute_s": "recompute",
               "tp_comm_s": "TP comm", "pp_comm_s": "PP comm", "bubble_s": "bubble", "dp_comm_s": "DP comm",
               "optimizer_s": "optimizer", "offload_s": "offload"}


def mapping_label(mapping: dict) -> str:
    """"tp8 pp4 dp128 mb1 il2": the split and the microbatch, what the engineer sets first."""
    text = f"tp{mapping['tensor_par']} pp{mapping['pipeline_par']} dp{mapping['data_par']} " \
           f"mb{mapping['microbatch_size']}"
    return text + (f" il{mapping['pipeline_interleaving']}" if mapping["pipeline_par"] > 1 else "")


def plot_breakdown(records: list[dict], out_dir: Path, limit: int = 40) -> list[Path]:
    """One stacked horizontal bar per solved problem (each term's share of the iteration), the
    best mapping, its iteration time and MFU written beside it."""
    solved = [r for r in records if (r.get("best") or {}).get("time")][:limit]
    if not solved:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(solved) + 2))
    left = [0.0] * len(solved)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    totals = [sum(r["best"]["time"].get(term, 0.0) for term in TIME_TERMS) or 1.0 for r in solved]
    for term, color in zip(TIME_TERMS, colors * 2):
        widths = [100 * r["best"]["time"].get(term, 0.0) / total for r, total in zip(solved, totals)]
        if any(widths):
            ax.barh(range(len(solved)), widths, left=left, color=color, label=TERM_LABELS.get(term, term))
            left = [a + b for a, b in zip(left, widths)]
    for i, r in enumerate(solved):
        ax.text(101, i, f"{mapping_label(r['best']['mapping'])}: {r['best']['iteration_time_s']:.4g} s, "
                         f"MFU {r['best']['mfu']:.1%}", va="center", fontsize=7)
    ax.set_yticks(range(len(solved)), [r["id"] for r in solved], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 150)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("share of the best mapping's iteration time (%)")
    ax.legend(fontsize=7, ncol=5, loc="lower right")
    more = f" (first {limit} of {len(records)})" if len(records) > limit else ""
    ax.set_title(f"Where the best mapping's time goes{more}", fontsize=10)
    return [save(fig, out_dir / "breakdown.png")]
