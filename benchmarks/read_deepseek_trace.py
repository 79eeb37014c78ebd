"""Read DeepSeek-V3's published H800 training trace into per-layer kernel time by category.

    python benchmarks/read_deepseek_trace.py PATH/TO/train.json [--out problems/measurements/deepseek-v3-h800-trace]

The trace is deepseek-ai/profile-data `train.json` (a PyTorch-profiler trace of DeepSeek-V3
training on H800: EP 64, TP 1, 4K sequence, routing forced balanced, DualPipe; one forward and
one backward chunk of 4 MoE layers). `git clone https://github.com/deepseek-ai/profile-data`
and pass its train.json. Every GPU kernel (`cat: kernel`) is put in one category by its name
(CATEGORIES, first match wins); a category's time per layer is its kernels' summed duration
over the 4 layers of the chunks (each layer runs once forward and once backward in the trace).
DeepEP's dispatch and combine kernels run on their own stream, overlapped: they are counted
apart (`communication`), not in the layer's compute.

Two kernels of one category sometimes run at once on two streams (the weight-gradient GEMMs
of two experts, streams 7 and 23): their summed durations count that time twice, so each
category also gets its busy time, the union of its kernels' intervals (`busy_us_per_layer`).
DeepSeek's GEMMs are persistent kernels of 112 thread blocks on the H800's 132 SMs: DualPipe
leaves 20 SMs to the communication kernels running beside them (DeepSeek-V3 technical report,
arXiv 2412.19437, section 3.2.2: "only 20 SMs are sufficient"); the reading records both counts
(`gemm_thread_blocks`, from the GEMM kernels' grids; `device_sms`, from the trace's
deviceProperties).

Tokens per microbatch: the per-token FP8 cast of the layer input runs one thread block per
token (grid 4096 × 128 threads, `per_token_cast_to_fp8_with_channels`): 4,096 tokens, one
4K sequence. Writes layer.json (categories, µs per layer, kernel counts) into --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

LAYERS = 4
"""MoE layers per chunk (the repository's README: 'Each chunk contains 4 MoE layers')."""

CATEGORIES: tuple[tuple[str, str], ...] = (
    ("communication", r"dpsk::ep::internode::(dispatch|combine|notify_dispatch|cached_notify)"),
    ("grouped_gemm", r"m_grouped_fp8"),
    ("wgrad_gemm", r"grouped_gemm::cuda::fp8_dptp128c_acc"),
    ("dense_gemm", r"grouped_gemm::cuda::fp8_ptp128c::|sm90_xmma_gemm_bf16"),
    ("attention", r"flash::|FlashAttn"),
    ("quantize", r"cast_to_fp8|cast_and_transpose|cast_back|batched_transpose|grouped_gemm::cuda::utils::transpose"),
    ("permute", r"get_fused_mapping|expand_to_fused|reduce_fused_impl|clean_and_count_expert|get_dispatch_layout"
                r"|unique_group_indices|fill_tensormaps"),
    ("norm", r"layer_norm::"),
    ("activation", r"swiglu"),
    ("rope", r"rotary_kernel"),
    ("router", r"topk|gatherTopK|sigmoid|aux_fi"),
    ("other_eltwise", r"."),
)
"""Each category and the regular expression its kernels' names match (first match wins):
dpsk::grouped_gemm's `m_grouped_fp8_ptp128c` is the experts' grouped GEMM (forward and
activation gradient, 16 = 4 layers × 4 launches), `fp8_dptp128c_acc` the weight-gradient GEMMs
accumulating into FP32 main gradients (60 launches on two streams), `fp8_ptp128c` the dense FP8
GEMMs (MLA projections, shared expert; forward and activation gradient) and the three BF16
`sm90_xmma_gemm_bf16` per layer the router's; the SwiGLU kernels that also cast to FP8 count as
quantisation (as the shared first reading counts them)."""


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    raise AssertionError("the last category matches every name")


GEMM_CATEGORIES = ("grouped_gemm", "wgrad_gemm", "dense_gemm")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The time covered by the union of (start, end) intervals: kernels running at once count once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if start > end:
            total, end = total + stop - start, stop
        elif stop > end:
            total, end = total + stop - end, stop
    return total


def read_trace(path: Path) -> dict:
    trace = json.loads(path.read_text())
    seconds = defaultdict(float)
    counts = defaultdict(int)
    intervals = defaultdict(list)
    gemm_blocks = set()
    tokens = None
    for event in trace["traceEvents"]:
        if event.get("cat") != "kernel":
            continue
        label = category(event["name"])
        seconds[label] += event["dur"]
        counts[label] += 1
        intervals[label].append((event["ts"], event["ts"] + event["dur"]))
        if label in GEMM_CATEGORIES and event["name"].startswith("void cutlass::device_kernel<dpsk"):
            grid = event["args"]["grid"]
            gemm_blocks.add(grid[0] * grid[1] * grid[2])
        if tokens is None and "per_token_cast_to_fp8_with_channels" in event["name"]:
            tokens = event["args"]["grid"][0]
    compute = sum(us for label, us in seconds.items() if label != "communication")
    compute_busy = busy_us([iv for label, ivs in intervals.items() if label != "communication" for iv in ivs])
    (blocks,) = gemm_blocks                    # one persistent grid for every DeepSeek GEMM
    return {
        "layers": LAYERS,
        "tokens_per_microbatch": tokens,
        "us_per_layer": {label: round(seconds[label] / LAYERS, 1) for label, _ in CATEGORIES},
        "busy_us_per_layer": {label: round(busy_us(intervals[label]) / LAYERS, 1) for label, _ in CATEGORIES},
        "kernels": {label: counts[label] for label, _ in CATEGORIES},
        "compute_us_per_layer": round(compute / LAYERS, 1),
        "compute_busy_us_per_layer": round(compute_busy / LAYERS, 1),
        "gemm_thread_blocks": blocks,
        "device_sms": trace["deviceProperties"][0]["numSms"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "problems/measurements/deepseek-v3-h800-trace")
    args = parser.parse_args()
    reading = read_trace(args.trace)
    reading["sha256_of_trace"] = hashlib.sha256(args.trace.read_bytes()).hexdigest()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "layer.json").write_text(json.dumps(reading, indent=1) + "\n")
    for label, us in reading["us_per_layer"].items():
        print(f"{label:>14}: {us:9.1f} us per layer ({reading['kernels'][label]} kernels)")
    print(f"compute (all but communication): {reading['compute_us_per_layer']:.1f} us per layer; "
          f"{reading['tokens_per_microbatch']} tokens per microbatch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
