"""Human-readable tables (rich) and JSON documents for evaluations and search results.
Units convert here, at the output boundary: seconds, GiB, GB/s, percent."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from costmodel.space.dimensions import BY_NAME, CHAIN, DIMENSIONS, NETWORK_GROUPS
from costmodel.evaluate import Evaluation
from costmodel.inputs.units import GB, GiB
from solver.search.distinct import equivalents_text

TIME_LABELS = {
    "forward_s": "forward (blocks + output layer)",
    "backward_s": "backward (activation + weight gradients)",
    "recompute_s": "recompute (+ fused attention's score redo)",
    "tp_comm_s": "TP communication, exposed (+ stolen compute)",
    "cp_comm_s": "CP K/V ring, exposed beyond the attention core (+ stolen compute)",
    "ep_comm_s": "EP all-to-all (MoE token dispatch + combine)",
    "pp_comm_s": "PP point-to-point",
    "bubble_s": "pipeline bubble",
    "dp_comm_s": "DP gradient reduction, exposed (+ stolen compute)",
    "optimizer_s": "optimizer step (+ a precision recipe's weight casts)",
    "offload_s": "offload traffic not hidden by compute",
}
MEMORY_LABELS = {
    "weights_bytes": "weights (with a recipe's quantized copies)",
    "weight_grads_bytes": "weight gradients (fp32 or 16-bit: grad_datatype)",
    "optimizer_bytes": "optimizer state (fp32 master + Adam moments)",
    "sharding_buffer_bytes": "ZeRO-2/3 buffer (a block's gradients; stage 3: two gathered blocks)",
    "embedding_bytes": "embedding (weights + grads + optimizer)",
    "activations_bytes": "stored activations (in flight)",
    "activation_workspace_bytes": "activation workspace (recompute)",
    "output_layer_bytes": "last stage: output layer and final norm (weights + grads + optimizer)",
    "logits_bytes": "last stage: logits (fp32, + 16-bit gradient) and their input",
    "last_stage_activations_bytes": "last stage: stored activations (in flight)",
    "second_stage_activations_bytes": "second stage: stored activations (in flight)",
    "runtime_reserve_bytes": "runtime reserve (CUDA context, NCCL buffers, fragmentation)",
    "first_stage_hbm_bytes": "first stage in HBM",
    "second_stage_hbm_bytes": "second stage in HBM (uneven stages: a middle stage may hold the most)",
    "last_stage_hbm_bytes": "last stage in HBM",
}


def console() -> Console:
    return Console(file=sys.stdout, soft_wrap=True)


def counted(count: int, noun: str) -> str:
    """"1 block", "2 blocks", "1,024 runs": a count with its noun, singular for one."""
    return f"{count:,} {noun if count == 1 else noun + 's'}"


def _fields_by_name(mapping_fields: dict) -> dict:
    values = {dim.name: mapping_fields.get(dim.field) for dim in DIMENSIONS}
    if values.get("sched") == "interleaved":   # (a file's name for 1F1B over chunks: the chunks are a column
        values["sched"] = "1f1b"               # of their own, and the equivalents name the schedule so)
    for dim in DIMENSIONS:     # a record from before a dimension joined: its file default
        if values[dim.name] is None and dim.kind == "network":
            values[dim.name] = 0
        elif (values[dim.name] is None and dim.kind in ("split", "per_split") and dim.default is not ...
              and not dim.model_decides):
            values[dim.name] = dim.default
    # a number a record left to the model (etp, or a record from before it): its declared
    # default, for a mixture-of-experts model where a folded degree (ep) is > 1
    moe = any((values[name] or 1) > 1 for name, _ in NETWORK_GROUPS if name not in CHAIN)
    for dim in DIMENSIONS:
        if values[dim.name] is None and dim.kind in ("split", "per_split") and dim.model_decides:
            values[dim.name] = dim.default(values, moe)
    return values


def mapping_summary(mapping_fields: dict) -> str:
    """A one-line description of a mapping (a Mapping's JSON fields) in the project's
    vocabulary (costmodel.space.dimensions): the split, batch and microbatch, the interleaving
    when pp > 1, each choice whose conditions on the split hold, the switches that are on,
    and the network of each parallel group."""
    v = _fields_by_name(mapping_fields)
    splits = {d.name: v[d.name] for d in DIMENSIONS if d.kind == "split"}
    # (the degrees that fold into a stage, ep and etp, only where one is > 1: a dense model's are 1)
    folded = any(splits[name] > 1 for name, _ in NETWORK_GROUPS if name not in CHAIN)
    parts = [" ".join(f"{name}{splits[name]}" for name, _ in NETWORK_GROUPS if name in CHAIN or folded),
             f"batch {v['batch']} {BY_NAME['microbatch'].header} {v['microbatch']}"]
    if v["pp"] > 1:
        parts.append(f"{BY_NAME['interleaving'].header} {v['interleaving']}")
    facts = {**{name: splits[name] for name, _ in NETWORK_GROUPS}, "dp_cp": splits["dp"] * splits["cp"]}
    for dim in DIMENSIONS:
        skeleton_rules = [c for c in dim.free_when if c.subject in facts]
        if dim.kind == "choice" and all(c.holds(facts) for c in skeleton_rules):
            parts.append(f"{dim.header} {v[dim.name]}")
        if dim.kind == "subgroup" and v[dim.name] is not None:     # a sub-group (hybrid sharding)
            parts.append(f"{dim.header} {v[dim.name]}")
    if not mapping_fields.get("fused_attention", True):
        parts.append("unfused attention")
    on = [dim.header for dim in DIMENSIONS if dim.kind == "switch" and v[dim.name]]
    if on:
        parts.append(" ".join(on))
    nets = "/".join(f"{name}{v[net]}" for name, net in NETWORK_GROUPS)
    return ", ".join(parts) + f", nets {nets}"


def mapping_cells(mapping_fields: dict) -> list[str]:
    """A mapping as table cells under `MAPPING_HEADERS`: every split and per-split number,
    every choice, the switches that are on, and the networks."""
    v = _fields_by_name(mapping_fields)
    cells = ["all" if v[d.name] is None else str(v[d.name]) for d in DIMENSIONS if d.kind in ("split", "per_split", "choice", "subgroup")]
    cells.append(" ".join(d.header for d in DIMENSIONS if d.kind == "switch" and v[d.name]) or "-")
    cells.append("/".join(str(v[net]) for _, net in NETWORK_GROUPS))
    return cells


MAPPING_HEADERS = (*(d.header for d in DIMENSIONS if d.kind in ("split", "per_split", "choice", "subgroup")), "on",
                   "nets " + "/".join(name for name, _ in NETWORK_GROUPS))


def top_table(entries, title: str) -> Table:
    """The top-k table `brute` and `solve` share. `entries`: (time s, MFU, HBM bytes, offload
    bytes, the mapping's JSON fields, the settings its group of equally good mappings also
    takes) per row, best first."""
    rows = [[str(rank), f"{time_s:.4f}", f"{mfu:.1%}", f"{hbm / GiB:.1f}", f"{offload / GiB:.1f}",
             *mapping_cells(fields), equivalents_text(same) or "-"]
            for rank, (time_s, mfu, hbm, offload, fields, same) in enumerate(entries, start=1)]
    headers = ("#", "time (s)", "MFU", "HBM (GiB)", "offload (GiB)", *MAPPING_HEADERS, "equally good")
    mapping_columns = range(5, len(headers) - 1)
    # a mapping column with one value in every row is stated once, under the table
    same = [n for n in mapping_columns if len(rows) > 1 and len({row[n] for row in rows}) == 1]
    caption = ("every row: " + ", ".join(f"{headers[n]} {rows[0][n]}" for n in same)) if same else None
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    kept = [n for n in range(len(headers)) if n not in same]
    for n in kept:
        # headers wrap at spaces (the networks' after "nets"); the equivalents one setting a line; a
        # cell still too long folds: nothing is cut
        table.add_column(headers[n].replace("nets ", "nets\n").replace(" (", "\n("), justify="left" if n == len(headers) - 1 else "right",
                         overflow="fold")
    for row in rows:
        table.add_row(*(row[n].replace("; ", "\n") if n == len(headers) - 1 else row[n] for n in kept))
    return fit_width(table)


TABLE_WIDTH_MAX = 120
"""Columns the top-k tables fit in (a terminal window beside another, or a 120-column log)."""


def fit_width(table: Table, width: int = TABLE_WIDTH_MAX) -> Table:
    """The table, held to `width` columns when it would be wider: rich then wraps its headers and
    the columns that may wrap instead of running past the edge."""
    natural = Console(width=10_000).measure(table).maximum
    if natural > width:
        table.width = width
    return table


def throughput_lead(throughput: dict | None, mfu: float | None) -> str:
    """"13,656 tokens/s/GPU, 702.9 model TFLOP/s/GPU, MFU 35.5 % of the float8 dense matrix peak
    (fp8-tensorwise recipe) 1,979 TFLOP/s": what a summary line leads with (a result's JSON `throughput`
    and `mfu`); the first two do not depend on a peak, the MFU names its own."""
    parts = []
    if throughput:
        parts.append(f"{throughput['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, "
                     f"{throughput['model_tflops_per_gpu']:,.1f} model TFLOP/s/GPU")
    if mfu is not None:
        peak = f" of the {throughput['peak']} {throughput['peak_tflops']:,.0f} TFLOP/s" if throughput else ""
        parts.append(f"MFU {mfu:.1%}{peak}")
    return ", ".join(parts)


def mfu_text(ev: Evaluation) -> str:
    """"MFU 41.2 % of the bfloat16 dense matrix peak 989 TFLOP/s" (causal attention halved)."""
    peak = "" if ev.throughput is None else f" of the {ev.throughput.peak_name} {ev.throughput.peak_tflops:,.0f} TFLOP/s"
    return f"MFU {100 * ev.mfu:.1f} %{peak}"


def evaluation_tables(ev: Evaluation, title: str = "mapping", band: str | None = None) -> list[Table]:
    """The time and memory breakdown of one evaluation; `band`: the line of its error band
    (solver.report.bands), printed under the iteration time."""
    head = Table(title=title, show_header=False)
    head.add_row("mapping", mapping_summary(ev.mapping.model_dump(mode='json')))
    head.add_row("feasible", "yes" if ev.feasible else "NO: " + "; ".join(ev.reasons))
    if ev.flops is not None:
        batch = ev.mapping.batch_size
        head.add_row("global batch", f"{batch:,} sequences = {batch * ev.flops.seq_size / 1e6:.1f}M tokens")
    head.add_row("iteration time", f"{ev.iteration_time_s:.4f} s")
    if band is not None:
        head.add_row("measured would be (error band)", band)
    head.add_row("sample rate", f"{ev.sample_rate:.2f} sequences/s")
    peak = "" if ev.throughput is None else f" of the {ev.throughput.peak_name} {ev.throughput.peak_tflops:,.0f} TFLOP/s"
    head.add_row("MFU (model FLOP, causal attention halved, no recompute)", f"{100 * ev.mfu:.2f} %{peak}")
    if ev.throughput is not None:
        t = ev.throughput
        head.add_row("throughput as published tables count it",
                     f"{t.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; {t.model_tflops_per_gpu:,.1f} model TFLOP/s per "
                     f"GPU (Megatron-Bridge's count: causal attention halved, vocabulary padded; "
                     f"{t.bridge_flops_per_token:.4g} FLOP per token)")
    head.add_row("HFU (hardware FLOP, with recompute)", f"{100 * ev.hfu:.2f} %{peak}")
    if ev.flops is not None:
        f = ev.flops
        head.add_row("model FLOP per token (MFU numerator)",
                     f"{f.per_token:.4g} = 6 × {f.matrix_params / 1e9:.4g} B "
                     f"{'active (k of E experts) ' if f.sparse else ''}"
                     f"matrix parameters + attention "
                     f"{f.attention_per_token:.4g} (half of the full s² {f.full_attention_per_token:.4g}: causal mask); "
                     f"{f.per_sequence:.4g} per sequence of {f.seq_size}")
    if ev.offload_bytes_per_s_needed > 0:
        head.add_row("offload bandwidth to hide traffic", f"{ev.offload_bytes_per_s_needed / GB:.1f} GB/s")

    time_table = Table(title="time per iteration")
    time_table.add_column("term")
    time_table.add_column("seconds", justify="right")
    time_table.add_column("share", justify="right")
    for key, label in TIME_LABELS.items():
        value = getattr(ev.time, key)
        time_table.add_row(label, f"{value:.4f}", f"{100 * value / ev.iteration_time_s:.1f} %")
    time_table.add_row("total", f"{ev.iteration_time_s:.4f}", "100.0 %", style="bold")

    mem_table = Table(title="memory per GPU: first pipeline stage, unless marked second or last")
    mem_table.add_column("term")
    mem_table.add_column("GiB", justify="right")
    for key, label in MEMORY_LABELS.items():
        if key.startswith("second_stage") and ev.mapping.pp <= 2:
            continue                      # with two stages the second is the last (one: the first), shown once
        if key in ("last_stage_activations_bytes", "last_stage_hbm_bytes") and ev.mapping.pp == 1:
            continue                      # one stage: the first is the last
        mem_table.add_row(label, f"{getattr(ev.memory, key) / GiB:.2f}")
    mem_table.add_row("in HBM (tier 1, the fullest stage)", f"{ev.hbm_bytes / GiB:.2f}", style="bold")
    mem_table.add_row("in offload memory (tier 2)", f"{ev.offload_bytes / GiB:.2f}", style="bold")
    return [head, time_table, mem_table]
