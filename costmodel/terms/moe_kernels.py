"""Every kernel one mixture-of-experts layer launches, as Megatron-Core runs it, and what the
ones the layer's formulas do not time cost (costmodel.terms.moe times the layer's bulk work:
router GEMM, score function and top-k, permutations, grouped GEMMs, activation, shared
experts; docs/cost-model.md, "The MoE layer's kernel inventory").

A step launches each kernel from the host. Timed one at a time, a kernel costs its GPU
latency; in a step each also pays the launch gap (`step.kernel_gap_us`, costmodel.terms.
step_terms), and the small kernels of an MoE layer — on router-sized tensors, or one per local
expert — cost little more than that. The inventory counts them from the code the published
rows ran (Megatron-Core core_r0.17.0 d7288711 and Transformer Engine 2.12–2.14, the 26.02–26.04
containers; megatron/core/transformer/moe/{router,moe_utils,token_dispatcher,experts}.py,
megatron/core/fusions/fused_bias_geglu.py, transformer_engine/pytorch/module/grouped_linear.py):

    forward                                            kernels             host syncs
    router GEMM (timed), fused score function + top-k  2
    all-to-all preprocess: token counts, splits         6 + 4 copies        1 (d2h_event.synchronize)
    fused permute: row-id map and permute               4
    sort / unsort by local expert (E/ep > 1)            2 + 3
    fc1, fc2: one cuBLAS GEMM per local expert          2·L                 (TE multi_stream_cublas_gemm)
    activation: fused kernel                            1
      clamped (gpt-oss): 2 clamps, cat, the offset's    + 4                 1 (torch.tensor(offset, device))
      copy to the GPU
    expert biases (fc2 bias × probs, per expert)        2·L + 1             (experts.py _apply_bias)
    fused unpermute                                     1
    flex dispatcher in place of the above: HybridEP     12                  1 (before the dispatch)
      preprocess, permutes and sorts; DeepEP            32                  6
    backward
    unpermute, unsort, sort, permute                    4 (3 with one local expert)
    fc1, fc2 activation and weight gradients            4·L
    activation backward: fused 1; clamped ~11
    expert biases: dbias and dprob per expert, cats     4·L + 3, + 2·L main-gradient adds
    router GEMMs, top-k backward, gradient merge,       5, + router bias gradient and its add 2
    the router weight's main-gradient add
    flex dispatcher in place of the permutes: HybridEP  8; DeepEP 13
    router training extras (the model's router_* fields; forward / backward):
      load-balancing loss, fused (TE fused_router)      aux_loss 5 / 5, seq_aux_loss 6 / 6,
                                                        global_aux_loss 8 / 5
      expert bias: tokens per expert counted            2 / 0
      float32 router: casts around the backward GEMMs   0 / 4

L = E/ep local experts. A precision recipe quantizes each expert's operands in its own kernel
(TE split_quantize: "quantize kernels individually"): the X and dY of fc1 and fc2, L each, where
the formulas time one pass per operand (the weights' scale swizzles are timed there too). The
flex dispatcher has no all-to-all preprocess; its own kernels and host syncs are its backend's
(FLEX_KERNELS). The router's training extras (AUX_LOSS_KERNELS, EXPERT_BIAS_KERNELS,
FP32_ROUTER_KERNELS) carry the router's T × E or T × h tensors: `router_extra_bytes` gives their
bytes, timed on HBM in costmodel.terms.moe. Not counted: the expert-bias update itself (once a
step, in finalize_model_grads: about 9 kernels and a copy per MoE layer of the stage, ~1 ms a step),
the load-balancing loss's all-reduce of E counts over tp·cp (a no-op at tp·cp 1), the float32
backward GEMMs' TF32 rate (timed at BF16's), and the force-balancing noise of benchmark runs.

Costs, one microbatch: each kernel beyond the timed ones its GPU latency plus the gap; each host
synchronisation one gap (the GPU idles until the host launches the next kernel). CUDA graphs
remove the gap where they capture: per-layer graphs (Megatron's cuda_graph_scope attn,
moe_router, moe_preprocess) capture the router and the preprocess, not the dispatch and the
experts, so those keep the gap and the timed kernels there pay it as well; a full-iteration
graph captures everything. Backward's counts are its own; `backward_extra_s` is what backward
costs beyond twice the forward's timed kernels (the rule the formulas follow).
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.context import Context

__all__ = ["MoeLaunches", "moe_launches", "router_extra_bytes"]

PREPROCESS_KERNELS = 6.0
"""token_dispatcher.py preprocess: routing_map.sum, the input splits' sum, a contiguous copy and three
more sums (core_r0.17.0 l.513-562)."""
PREPROCESS_COPIES = 4.0
"""the device-to-host copies of tokens_per_expert and the splits (l.867-899)."""
PERMUTE_KERNELS = 4.0
"""TE's fused permute: three row-id-map passes and the permute (transformer_engine/pytorch/triton/permutation.py)."""
SORT_KERNELS, UNSORT_KERNELS = 2.0, 3.0
"""sort_chunks_by_idxs before the experts, and after them a transposed copy and the sort back (l.737, 772-777)."""
CLAMP_KERNELS_FORWARD = 4.0
"""fused_bias_geglu.py l.424-434: two clamps, a cat, and the offset copied to the GPU, before the compiled kernel."""
CLAMP_KERNELS_BACKWARD = 10.0
"""beyond the compiled kernel's backward: clamp_backward's fill, compare and where (3 and 5 kernels,
PyTorch FunctionsManual.cpp) and the split's cat."""
ROUTER_BACKWARD_KERNELS = 3.0
"""beside the router's two backward GEMMs: the fused top-k's backward (TE fused_topk_with_score_function's
backward kernel), the merge of the router's and the permutation's input gradients, and the
main-gradient add of the router's weight (distributed_data_parallel.py l.441-445); a router bias
adds its gradient's sum and its add."""
FLEX_KERNELS = {"hybridep": (12.0, 8.0, 1.0), "deepep": (32.0, 13.0, 6.0)}
"""The flex dispatcher's kernels beside its communication, forward and backward, and its host syncs a
forward, by backend (Kernels.moe_flex_backend; Megatron-Core core_r0.17.0 token_dispatcher.py
_HybridEPManager / _DeepepManager, fused_a2a.py; TE 2.12 permutation.py).

HybridEP (DeepEP commit 34152ae, Megatron-Core's pin; hybrid_ep_backend.cuh, executor.cu, permute.cu):
forward the routing map's memset and scan, permute_preprocessing, pad_tokens_per_expert, the dispatch's
expected-value update and two device syncs, the permute, and the combine's unpermute, update and two
device syncs (12); backward the same four around each pass's communication, twice (8). One host sync a
forward: cudaStreamSynchronize before the dispatch (non_blocking False, dropless).

DeepEP's normal kernels (32 forward): setup_metadata's top-k (1); get_dispatch_layout, notify_dispatch
and dispatch (3; the host waits for notify_dispatch's received counts: 1 sync); _indices_to_multihot
with the experimental fusions off (Megatron's default: two zero fills, the mask, two boolean-mask
gathers of two kernels each, an arange, the mask's row sums, repeat_interleave's scan and copy, two
index_put, the cast to bool: 14 kernels; the two masked gathers and repeat_interleave each wait for a
count: 3 syncs); TE's moe_permute_and_pad_with_probs, which every DeepEP permute takes (tokens_per_expert
is passed): tokens_per_expert copied to the GPU, divided, rounded up, multiplied and cast, compared with
torch.equal, summed for .item() (7; the compare and the .item() wait: 2 syncs), then the row-id map's
three passes and the permute (4); the unpermute (1); cached_notify_combine and combine (2). Backward
(13): the combine's backward as a cached dispatch (notify and dispatch, 2), the unpermute's and the
permute's backward (3), the masked gathers' backward (zero fill, index_put, gather: 3), the dispatch's
backward as a combine (notify, combine and the probabilities' float cast: 3), the top-k's backward
(zero fill and scatter: 2). DeepEP thus launches 20 more kernels and 5 more host syncs a forward than
HybridEP; the padding branch (pad lengths, cumsum, zeros, cat: 4) runs only when an expert's count is
not a multiple of the alignment, and is not counted."""


AUX_LOSS_KERNELS = {"none": (0.0, 0.0), "aux_loss": (5.0, 5.0), "seq_aux_loss": (6.0, 6.0),
                    "global_aux_loss": (8.0, 5.0)}
"""The load-balancing loss's kernels, forward and backward, with the fused router (moe_router_fusion, every
MoE preset; Megatron-Core core_r0.17.0 router.py l.639-668 and moe_utils.py; TE 2.12 pytorch/router.py, one
kernel each of tex.fused_score_for_moe_aux_loss_fwd/bwd and fused_moe_aux_loss_fwd/bwd,
common/fused_router/*.cu).

Forward: compute_routing_scores_for_aux_loss (moe_utils.py l.826-875) 1, the scores and a routing map from
the logits; get_tokens_per_expert_and_token_count (l.227-246) routing_map.sum 1; switch_load_balancing_loss_func
(l.59-146) the fused loss 1 (one 8-block cluster, fused_moe_aux_loss.cu l.170-200); seq_aux_loss divides it by
the batch (router.py l.357-368) 1; attach_and_log_load_balancing_loss (l.426-495): `aux_loss / aux_loss_coeff`
and the tracker's `values[layer_number - 1] += loss` (save_to_aux_losses_tracker, moe_utils.py l.943-977) 2;
MoEAuxLossAutoScaler's forward returns its input (none). aux_loss 5, seq_aux_loss 6; global_aux_loss (l.380-424)
adds the running `global_tokens_per_expert +=`, `ga_steps += 1` and their quotient: 8.
Backward: MoEAuxLossAutoScaler.backward (moe_utils.py l.269-286) ones_like and the scale 2; the loss's backward
1 (seq_aux_loss: and the division's 1); the scores' backward 1; the logits' two gradients (top-k's and the
loss's) summed 1: aux_loss 5, seq_aux_loss 6, global_aux_loss 5."""
EXPERT_BIAS_KERNELS = 2.0
"""router.py l.573-585 `_apply_expert_bias`, every forward with gradients on: routing_map.sum(dim=0) and its
add into local_tokens_per_expert (2 kernels eager; a compiled jit_fuser could fuse them into one)."""
FP32_ROUTER_KERNELS = 4.0
"""moe_utils.py l.1339-1373 RouterGatingLinearFunction.backward with router_dtype float32 and BF16 weights
and inputs (Float16Module): weight.to(fp32) and inp.to(fp32) before the two GEMMs, and the results cast back,
grad_input to the input's and grad_weight to the weight's dtype; forward's GEMM writes float32 logits itself
(TE general_gemm with an fp32 output, l.1325-1326), no cast. The two backward GEMMs take float32 operands
(TE cublaslt_gemm.cu l.447-450: TF32)."""


def router_extra_bytes(c: Context, routed_tokens):
    """Bytes the router's training extras move, forward and backward, one microbatch: the
    load-balancing loss's passes over the T × E scores (each r bytes, r = 4 for a float32
    router, else e; a routing map 1 byte), the expert bias's count over the routing map, and
    a float32 router's two casts of the T × h input and its gradient (6 bytes an element
    each) and of the E × h weight and its gradient."""
    r = 4.0 if c.model.router_fp32 else c.precision.elem_bytes
    scores = routed_tokens * c.model.experts
    aux = 0.0 if c.model.router_load_balancing == "none" else 1.0
    bias = 1.0 if c.model.router_expert_bias else 0.0
    fp32 = 1.0 if c.model.router_fp32 else 0.0
    # forward: the aux scores (read logits; write scores, map, intermediate), the map's sum, the loss's read
    forward = aux * scores * ((3 * r + 1) + 1 + r) + bias * scores
    # backward: the loss's gradient written, the scores' backward (read 2, write 1), the two gradients' sum
    backward = aux * scores * (r + 3 * r + 3 * r) + fp32 * 12 * c.model.hidden * (routed_tokens + c.model.experts)
    return forward, backward


@dataclass(frozen=True)
class MoeLaunches:
    """What one MoE layer's untimed kernels and host synchronisations cost, one microbatch."""

    forward_s: object
    backward_extra_s: object
    activation_s: object
    """the part of forward_s in the activation (what recompute_modules moe_act reruns)"""
    forward_kernels: object
    backward_kernels: object


ROUTER_TIMED = 3.0
"""the router's kernels the formulas time: its GEMM, the softmax and the top-k."""


def _shared_kernels(c: Context) -> float:
    """The shared experts' forward kernels: two GEMMs and, gated or unfused, the activation."""
    if not c.model.shared_feedforward:
        return 0.0
    return 3.0 if c.model.gated_mlp or not c.settings.fused_activation else 2.0


def _timed_expert_forward(c: Context, xp, local):
    """Kernels the MoE formulas time in forward beside the router's (costmodel.terms.moe.
    moe_layer_forward): two expert GEMMs, the activation, the permutations, the shared experts."""
    activation = 1.0 if c.model.gated_mlp or not c.settings.fused_activation else 0.0
    permutes = 2.0 if c.settings.moe_flex_dispatcher else 2.0 + xp.where(local > 1, 2.0, 0.0)
    return 2.0 + activation + permutes + _shared_kernels(c)


def moe_launches(c: Context, xp, local) -> MoeLaunches:
    """The inventory's kernels beyond the timed ones, and their cost, for `local` experts per GPU."""
    several = xp.where(local > 1, 1.0, 0.0)
    quantized = 1.0 if c.precision.recipe is not None and c.precision.recipe.format.quantized else 0.0
    bias = 1.0 if c.model.expert_bias else 0.0
    clamp = 1.0 if c.model.clamped_activation else 0.0
    alltoall = 0.0 if c.settings.moe_flex_dispatcher else 1.0
    flex_forward, flex_backward, flex_syncs = FLEX_KERNELS[c.settings.moe_flex_backend]
    shared = _shared_kernels(c)

    aux_fwd, aux_bwd = AUX_LOSS_KERNELS[c.model.router_load_balancing]
    router_fwd = (2.0 + alltoall * (PREPROCESS_KERNELS + PREPROCESS_COPIES) + aux_fwd
                  + (EXPERT_BIAS_KERNELS if c.model.router_expert_bias else 0.0))
    permutes_fwd = (alltoall * (PERMUTE_KERNELS + 1.0 + several * (SORT_KERNELS + UNSORT_KERNELS))
                    + (1 - alltoall) * flex_forward)
    permutes_bwd = alltoall * (3.0 + several) + (1 - alltoall) * flex_backward
    expert_fwd = (permutes_fwd + 2 * local + 1.0 + clamp * CLAMP_KERNELS_FORWARD + bias * (2 * local + 1) + shared
                  + quantized * 2 * (local - 1))
    router_bwd = (2.0 + ROUTER_BACKWARD_KERNELS + (2.0 if c.model.router_has_bias else 0.0) + aux_bwd
                  + (FP32_ROUTER_KERNELS if c.model.router_fp32 else 0.0))
    expert_bwd = (permutes_bwd + 4 * local + 1.0 + clamp * CLAMP_KERNELS_BACKWARD
                  + bias * (6 * local + 3) + 2 * shared + quantized * 2 * (local - 1))
    timed_expert_fwd = _timed_expert_forward(c, xp, local)

    latency = c.memory.hbm_latency_s - c.step.kernel_gap_s           # the GPU's own cost of a small kernel
    router_gap = c.step.kernel_gap_s                          # captured by per-layer graphs
    expert_gap = c.step.kernel_gap_s + c.step.outer_gap_extra_s    # captured only by a full-iteration graph
    syncs_fwd = alltoall + (1 - alltoall) * flex_syncs + clamp   # the dispatcher's, the clamp offset's
    forward = ((router_fwd - ROUTER_TIMED) * (latency + router_gap)
               + (expert_fwd - timed_expert_fwd) * (latency + expert_gap)
               + timed_expert_fwd * c.step.outer_gap_extra_s + syncs_fwd * expert_gap)
    backward = ((router_bwd - 2 * ROUTER_TIMED) * (latency + router_gap)
                + (expert_bwd - 2 * timed_expert_fwd) * (latency + expert_gap)
                + 2 * timed_expert_fwd * c.step.outer_gap_extra_s)
    activation = clamp * (CLAMP_KERNELS_FORWARD * (latency + expert_gap) + expert_gap)
    return MoeLaunches(forward, backward - 2 * forward, activation, router_fwd + expert_fwd, router_bwd + expert_bwd)
