"""Benchmark: one DeepSeek-V3 MoE layer as the cost model times it, beside DeepSeek's H800 trace.

    python benchmarks/bench_moe_trace.py

The trace is problems/measurements/deepseek-v3-h800-trace/layer.json (deepseek-ai/profile-data
train.json read by benchmarks/read_deepseek_trace.py): one MoE layer's kernels, forward and
backward (activation and weight gradient), 4,096 tokens per microbatch, EP 64, TP 1, FP8 with
128-wide block scales. The model: problems/models/deepseek-v3 on problems/systems/h800-80g-nvl8.yaml
at that mapping (tp 1, ep 64, etp 1, microbatch 1, sequence 4,096, fp8-blockwise, fused
attention; full-iteration CUDA graphs, so that no kernel carries the step's launch gap: the
trace's categories are kernel time, and the idle time between kernels is in none of them),
one MoE block's layers (costmodel.terms.block.block_layers) split into the trace's
categories:

    dense_gemm    the attention projections and the shared experts, forward + activation gradient,
                  and the router's BF16 GEMM (forward, and its two backward GEMMs)
    grouped_gemm  the routed experts' grouped GEMMs, forward + activation gradient
    wgrad_gemm    every weight-gradient GEMM but the router's (the layers' weight_grad_s: under
                  fp8-blockwise on Hopper at their own shape, at the recipe's
                  weight_grad_efficiency, fitted on DeepGEMM's published table, not on this trace)
    attention     the attention core, forward + backward (with what its kernel recomputes)
    quantize      the recipe's quantisation passes, forward + backward (costmodel.terms.quantize)
    permute       token permutation and unpermutation (costmodel.terms.moe.permutation_s)
    norm          the two RMSNorms (and the latent attention's inner ones), forward + backward
    other         every other element-wise kernel: RoPE, activation, router scores, residuals

DeepSeek's recomputation (every RMSNorm and the MLA up-projections with their RoPE, rerun in
backward) is added where it lands: the up-projections in dense_gemm, the norms in norm, RoPE in
other.

Backward's element-wise kernels cost twice forward's (costmodel.terms.layers), the permutations
once (each runs as its inverse: costmodel.terms.moe.MoeLayerForward.permute_s). Communication
(DeepEP) is overlapped in the trace and left out of both sides. Prints each category, the
ratio and the layer's total; asserts nothing.

Two readings of the trace, not fits (benchmarks/read_deepseek_trace.py):
- the trace's side is each category's busy time (two weight-gradient GEMMs running at once on
  two streams count once), and the total is the compute's busy time;
- the trace's compute ran beside DeepEP's kernels, which hold 20 of the H800's 132 SMs
  (DeepSeek's GEMMs are persistent grids of 112 thread blocks: `gemm_thread_blocks`,
  `device_sms`). The model's compute-bound categories (the GEMMs and the attention core) are
  put on the SMs left: × device_sms / gemm_thread_blocks, the same for every such category.
  Memory-bound kernels keep their time: 112 SMs still draw the HBM's bandwidth.
"""

from __future__ import annotations

import json
from pathlib import Path

from costmodel.terms.context import Context
from costmodel.evaluate import _scalar_fields
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.ops import ScalarOps
from costmodel.terms.attention import attention_projections
from costmodel.terms.block import block_forward, block_layers
from costmodel.terms.layers import norm_flops_per_elem, norm_output_bytes
from costmodel.terms.moe import moe_layer_forward

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "problems/measurements/deepseek-v3-h800-trace/layer.json"
COMPUTE_BOUND = ("dense_gemm", "grouped_gemm", "wgrad_gemm", "attention")
"""The categories whose kernels run at the rate of the SMs they hold."""
TRACE_CATEGORIES = {
    "dense_gemm": ("dense_gemm",), "grouped_gemm": ("grouped_gemm",), "wgrad_gemm": ("wgrad_gemm",),
    "attention": ("attention",), "quantize": ("quantize",), "permute": ("permute",), "norm": ("norm",),
    "other": ("activation", "rope", "router", "other_eltwise"),
}


def trace_mapping(tokens: int) -> Mapping:
    """The trace's layout for one layer: tp 1, ep 64 over 64 GPUs, one sequence per microbatch."""
    return Mapping(num_procs=64, tensor_par=1, expert_par=64, pipeline_par=1, data_par=64, batch_size=64,
                   microbatch_size=1, datatype="bfloat16", precision="fp8-blockwise", fused_attention=True,
                   fused_activation=True, expert_tensor_par=1, moe_dispatcher="flex",
                   cuda_graphs="full-iteration")


def model_categories(c: Context, m, xp) -> dict:
    """Seconds per category for one MoE layer, forward and backward, with the recomputation the
    trace runs: DeepSeek-V3 recomputes every RMSNorm and the MLA up-projections (with their RoPE)
    in backward (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.3.1)."""
    layers = block_layers(c, m, xp, "moe")
    block = block_forward(c, m, xp, layers)
    (attention,) = layers.by_name("attention")
    (moe,) = layers.by_name("moe")
    norms = sum(layer.eltwise_s for layer in layers.by_name("norm"))
    residuals = sum(layer.eltwise_s for layer in layers.by_name("residual"))
    tokens = m.microbatch * c.model.seq
    parts = moe_layer_forward(c, xp, tokens, m.tp, m.ep, m.etp)
    projections = attention_projections(c, xp, tokens, tokens, m.tp, m.seq_par, norm_output_bytes(c),
                                        norm_flops_per_elem(c))
    core = attention.attention_core_s
    dense_fwd = attention.gemm_s - core + parts.shared_gemm_s
    rope = attention.eltwise_s - projections.eltwise_s     # the fused core has no element-wise pass of its own
    moe_other = parts.eltwise_s - parts.permute_s
    return {
        "dense_gemm": 2 * dense_fwd + projections.up_s + 3 * parts.router_gemm_s,
        "grouped_gemm": 2 * parts.expert_gemm_s,
        "wgrad_gemm": attention.weight_grad_s - core + moe.weight_grad_s - parts.router_gemm_s,
        "attention": 3 * core + attention.kernel_recompute_s,
        "quantize": block.quantize_fwd_s + block.quantize_bwd_s,
        "permute": 2 * parts.permute_s,
        "norm": 4 * (norms + projections.eltwise_s),
        "other": 4 * rope + 3 * (moe_other + residuals),
    }


def main() -> int:
    trace = json.loads(TRACE.read_text())
    model = load_model(ROOT / "problems/models/deepseek-v3/config.json", seq_size=trace["tokens_per_microbatch"])
    system = load_system(ROOT / "problems/systems/h800-80g-nvl8.yaml")
    mapping = trace_mapping(trace["tokens_per_microbatch"]).with_model_defaults(True)
    c = Context.build(model, system, mapping.datatype, mapping.kernels)
    predicted = at_trace_sms(model_categories(c, _scalar_fields(mapping), ScalarOps), trace)
    print(f"DeepSeek-V3 MoE layer on {system.name}, tp 1 ep 64, {trace['tokens_per_microbatch']} tokens, "
          f"fp8-blockwise; forward + backward, us per layer (trace: busy time; model: GEMMs and attention on "
          f"{trace['gemm_thread_blocks']} of {trace['device_sms']} SMs)")
    print(f"{'category':>14} {'model':>9} {'trace':>9} {'model/trace':>12}")
    measured = trace_categories(trace)
    for name, seconds in predicted.items():
        print(f"{name:>14} {1e6 * seconds:9.0f} {measured[name]:9.0f} {1e6 * seconds / measured[name]:12.2f}")
    total_model, total_trace = 1e6 * sum(predicted.values()), trace["compute_busy_us_per_layer"]
    print(f"{'total':>14} {total_model:9.0f} {total_trace:9.0f} {total_model / total_trace:12.2f}")
    within = [name for name in predicted if abs(1e6 * predicted[name] / measured[name] - 1) <= 0.20]
    print(f"categories within 20 %: {len(within)} of {len(TRACE_CATEGORIES)} ({', '.join(within) or 'none'}); "
          f"total within 10 %: {'yes' if abs(total_model / total_trace - 1) <= 0.10 else 'no'}. "
          "Nothing in the model is fitted on this trace: every category is a check.")
    return 0


def trace_categories(trace: dict) -> dict:
    """µs per layer of each of the check's categories: the busy time of the trace's categories in it."""
    return {name: sum(trace["busy_us_per_layer"][label] for label in labels)
            for name, labels in TRACE_CATEGORIES.items()}


def at_trace_sms(predicted: dict, trace: dict) -> dict:
    """The model's categories with the compute-bound ones on the SMs the trace's kernels held."""
    slower = trace["device_sms"] / trace["gemm_thread_blocks"]
    return {name: seconds * slower if name in COMPUTE_BOUND else seconds for name, seconds in predicted.items()}


if __name__ == "__main__":
    raise SystemExit(main())
