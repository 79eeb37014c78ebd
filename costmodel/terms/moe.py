"""One mixture-of-experts (MoE) layer on one GPU for one microbatch: router, token dispatch
and combine, the experts' grouped GEMMs, the shared experts, and the memory the layer holds.

The layer replaces the MLP of every `moe_every`-th block (costmodel.inputs.model). It runs as
Megatron-LM's MoELayer with the all-to-all token dispatcher (megatron/core/transformer/moe/:
moe_layer.py, token_dispatcher.py `MoEAlltoAllTokenDispatcher`, experts.py) does:

    router GEMM · softmax · top-k · permute → all-to-all (ep) → all-gather (etp) → sort by local
    expert → grouped GEMMs h→f_e (gated: h→2f_e) · activation · f_e→h → unsort → reduce-scatter
    (etp) → all-to-all (ep) → unpermute (weighted sum of the k expert outputs)

with the shared experts, a dense MLP of width f_s on every token, beside it. Notation: T =
tokens of the microbatch on one tensor-parallel group (b·s, the `tokens` of block.py), h
hidden, E experts, k experts per token, f_e one expert's width, f_s the shared experts'
total width (Megatron-LM runs them as one MLP), t = tp, p = ep (the expert-parallel degree;
p divides E), x = etp (the expert tensor-parallel degree; x divides f_e), c the capacity
factor (Kernels.capacity_factor), e bytes per element.

Parallel layout, as Megatron-LM's:
- With t > 1 Megatron-LM requires sequence parallelism for MoE layers (its argument check
  "When using MoE and tensor parallelism, sequence parallelism must be used"), so each GPU
  routes T/t tokens.
- MoE parallel folding (Liu et al. 2025, arXiv 2504.14960; Megatron-LM's expert rank
  generator, costmodel.space.dimensions.DEGREES): the expert layers regroup a pipeline stage's
  tp·cp·dp GPUs into etp × ep × edp, edp = tp·cp·dp/(ep·etp), each GPU keeping its T/t
  routed tokens. Each expert's width is split x ways (`--expert-tensor-parallel-size`;
  x = t is Megatron's default and the layout before folding).
- The p GPUs of an expert-parallel group hold different tokens and E/p experts each; every
  GPU's routed rows go to the GPUs holding their experts (the all-to-all over ep), and the x
  GPUs of an expert tensor-parallel group gather what they received (the all-gather over
  etp: token_dispatcher.py gathers over the expert tensor-parallel group). A local expert
  receives rows from p·x sources:
      rows per local expert  r = (T/t) · k · c / E · x · p
  (Megatron's capacity = num_tokens · topk · capacity_factor / num_experts per source rank,
  × etp·ep sources); with x = t, r = T·k·c·p/E as before folding.
- Shared experts and the router follow the dense part: shared experts split tp ways like a
  dense MLP (their input is the gathered T tokens; the TP collectives around them are the
  block's MLP-region ones, not counted here), the router replicated on every tp rank.

The capacity factor c costs every expert at c × its mean load: exact for Megatron-LM's
token-dropping mode padded to capacity (`--moe-expert-capacity-factor c
--moe-pad-expert-input-to-capacity`), where every expert computes, and every all-to-all
moves, exactly that many rows; for dropless training it stands for the busiest expert's load
over the mean, which sets when the all-to-all and the layer finish (an upper bound when a GPU
holds several experts, as not all of them are the busiest).

The flex dispatcher (DeepEP / HybridEP, Kernels.moe_dispatcher) sends a token once per
destination GPU and fuses the source-side permutations into its kernels (`flex_dispatch_s`,
`permutation_s`); with Megatron-LM's overlap_moe_expert_parallel_comm the dispatch and combine
run beside another microbatch's compute (costmodel.terms.block_terms, `ep_overlap_terms`).

Times are forward; backward does twice each compute term (block.py's rule: two GEMMs per
forward GEMM, element-wise backward twice the traffic) and repeats each collective once (the
gradient of a dispatch is a combine and vice versa: `MoeCommunication.per_pass_s`).
Written against costmodel.ops: `tokens`, `tp`, `ep`, `etp` and the network indices may be numpy
arrays. Not modelled: token dropping's effect on training, expert-choice routing, routing
limited to a few devices or nodes, the shared experts run beside the all-to-all
(moe_shared_expert_overlap), and Qwen2-MoE's sigmoid gate multiply on
the shared output (its h × 1 GEMM is in the router's).

The kernel helpers (gemm_s, matmul_s, eltwise_s) live in costmodel.terms.layer_time, below both this
module and block.py, which calls into this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.comm import collective_s
from costmodel.terms.context import Context
from costmodel.terms.kernel_time import gemm_time_s
from costmodel.terms.layer_time import (ACTIVATION_FLOPS_PER_ELEM, SOFTMAX_FLOPS_PER_ELEM, eltwise_s, gemm_s, matmul_s,
                                        weight_grad_s)
from costmodel.terms.moe_kernels import moe_launches, router_extra_bytes
from costmodel.terms.quantize import GemmOperands
from costmodel.inputs.system import Collective

# Top-k selection over a token's E router scores: about one compare and one select per score
# (a k-way selection kept in registers; torch.topk on a few hundred values per row). Like every
# element-wise layer it is bound by HBM, so the count only matters on a slow vector unit.
TOPK_FLOPS_PER_ELEM = 2.0
# Unpermute multiplies each of the k expert outputs by its routing weight and adds it up:
# a multiply-add per routed element.
UNPERMUTE_FLOPS_PER_ELEM = 2.0


def expert_rows(c: Context, tokens, tp, ep, etp):
    """Rows each local expert multiplies (the busiest, at the capacity factor): (T/t)·k·c·p·x/E."""
    return tokens / tp * c.model.experts_per_token * c.settings.capacity_factor * ep * etp / c.model.experts


def grouped_gemm_s(c: Context, xp, experts, rows, cols, depth):
    """Time of `experts` GEMMs C[rows, cols] = A[rows, depth]·B[depth, cols] in one grouped
    kernel (each expert's operands and result moved once): the system's grouped-GEMM fit when
    it has one (`compute.<datatype>.grouped_gemm`: kernel_time.gemm_time_s with batch =
    experts), else this datatype's GEMM model with batch = experts — one launch for the group,
    each expert's shape — which predicts the measured H100 grouped GEMMs within 4.4 % median
    (docs/cost-model.md, "Mixture of experts")."""
    num_bytes = c.precision.gemm_elem_bytes * experts * (rows * depth + depth * cols + rows * cols)
    if c.compute.grouped_gemm is not None:
        return gemm_time_s(c.compute.grouped_gemm, xp, rows, cols, depth, num_bytes, c.compute.matrix_flops_per_s,
                           c.memory.hbm_bytes_per_s, experts)
    return gemm_s(c, xp, rows, cols, depth, num_bytes, batch=experts)


def permutation_s(c: Context, xp, routed_elems, gathered_elems, local):
    """The layer's permute and unpermute passes, memory-bound, one microbatch forward.

    alltoall (Megatron-LM's MoEAlltoAllTokenDispatcher, moe_utils.permute / unpermute): the
    source GPU copies each of its routed rows, k per token, into expert order (read + write),
    and after the combine reads the k expert outputs of a token and writes their weighted sum;
    with several local experts the received rows are sorted by expert before the GEMMs and back
    after them (sort_chunks_by_idxs), two more copies of the received rows.
    flex (MoEFlexTokenDispatcher with DeepEP / HybridEP): the dispatch kernel reads each token
    once from its unpermuted buffer and the combine kernel sums the weighted expert outputs
    (DeepEP's dispatch/combine with topk_weights), so the source-side passes are gone; the
    received rows are permuted into expert order and back (dispatch_postprocess,
    combine_preprocess), two copies of the received rows whatever the local expert count."""
    e, k = c.precision.elem_bytes, c.model.experts_per_token
    received = 2 * eltwise_s(c, xp, gathered_elems, 0.0, 2 * e)
    if c.settings.moe_flex_dispatcher:
        return received
    return (eltwise_s(c, xp, routed_elems, 0.0, 2 * e)
            + eltwise_s(c, xp, routed_elems, UNPERMUTE_FLOPS_PER_ELEM, e * (k + 1) / k)
            + xp.where(local > 1, received, 0.0))


def fp32_router_backward_s(c: Context, xp, routed_tokens, cols, bf16_gemm_s):
    """What a float32 router's two backward GEMMs (input and weight gradients, each T × cols × h)
    cost beyond the rule's two BF16 GEMMs (`bf16_gemm_s` each): they take float32 operands and
    run at the system's TF32 rate, on the roofline of its float32 entry (4 bytes an element),
    each paying the launch gap. 0 without a float32 router or a float32 entry."""
    if not c.model.router_fp32 or c.compute.router_tf32_flops_per_s <= 0.0:
        return 0.0
    h = c.model.hidden
    flops = 2 * routed_tokens * cols * h
    compute = flops / (c.compute.router_tf32_flops_per_s * xp.lookup(c.compute.router_tf32_curve, flops))
    num_bytes = 4 * (routed_tokens * h + h * cols + routed_tokens * cols)
    memory = num_bytes / (c.memory.hbm_bytes_per_s * xp.lookup(c.memory.hbm_curve, num_bytes))
    return 2 * (xp.maximum(compute, memory) + c.step.kernel_gap_s - bf16_gemm_s)


@dataclass(frozen=True)
class MoeLayerForward:
    """The forward pass of one MoE layer (in place of a block's MLP), one microbatch, one GPU
    (each a scalar or an array)."""

    router_gemm_s: object
    """the router: (T/t) × (E, + 1 with a shared-expert gate) × h"""
    expert_gemm_s: object
    """the E/p local experts' up (h→f_e/x, gated h→2f_e/x) and down (f_e/x→h) GEMMs on r rows
    each: grouped when a GPU holds several experts, one GEMM each when it holds one"""
    shared_gemm_s: object
    """the shared experts as one dense MLP on all T tokens, split tp ways (0 without)"""
    eltwise_s: object
    """router softmax and top-k, the permutations, the experts' and shared experts' activations"""
    matrix_flops: object
    """FLOP of the three GEMM terms (the experts' at the capacity factor's rows)"""
    local_experts: object
    """E/p experts on this GPU"""
    rows_per_expert: object
    """r = (T/t)·k·c·p·x/E rows per local expert"""
    expert_activation_s: object = 0.0
    """the routed experts' activation (part of eltwise_s): what recompute_modules moe_act reruns"""
    router_eltwise_s: object = 0.0
    """the router's score function and top-k (part of eltwise_s)"""
    permute_s: object = 0.0
    """the permute and unpermute passes (part of eltwise_s: permutation_s). Backward runs each
    once, as its inverse: Transformer Engine's moe_permute backward is one unpermute of the
    gradient and moe_unpermute's one permute (transformer_engine/pytorch/permutation.py), and
    since Megatron-Core 0.12 the unpermute merges no router probabilities (the experts apply
    them: `permuted_probs`), so no backward pass reads the forward rows again."""
    shared_activation_s: object = 0.0
    """the shared experts' activation (part of eltwise_s)"""
    launches_s: object = 0.0
    """the kernels and host synchronisations the terms above do not time (part of eltwise_s;
    costmodel.terms.moe_kernels), its activation's part in expert_activation_s too"""
    launches_backward_extra_s: object = 0.0
    """what backward's untimed kernels cost beyond twice launches_s"""
    weight_grad_s: object = None
    """backward's weight-gradient GEMMs, the router's as long as its forward and the experts' and
    shared experts' at their own shape, where the recipe times them so
    (costmodel.terms.layer_time.weight_grad_s; None: as long as gemm_s)"""

    @property
    def gemm_s(self):
        return self.router_gemm_s + self.expert_gemm_s + self.shared_gemm_s

    @property
    def compute_s(self):
        return self.gemm_s + self.eltwise_s


def moe_layer_forward(c: Context, xp, tokens, tp, ep, etp) -> MoeLayerForward:
    """Forward compute of one MoE layer on one GPU: `tokens` = T (b·s of the tp group; each GPU
    routes T/tp of them), `tp` the tensor-parallel, `ep` the expert-parallel and `etp` the
    expert tensor-parallel degree."""
    e, h, k, E = c.precision.elem_bytes, c.model.hidden, c.model.experts_per_token, c.model.experts
    routed_tokens = tokens / tp                        # this GPU's sequence-parallel shard
    local = E / ep
    rows = expert_rows(c, tokens, tp, ep, etp)
    f_cols = c.model.expert_feedforward / etp
    up_cols = 2 * f_cols if c.model.gated_mlp else f_cols    # gated: gate and up side by side, as block.py
    act_flops = ACTIVATION_FLOPS_PER_ELEM[c.model.mlp]

    router_cols = E + (1.0 if c.model.shared_expert_gate else 0.0)
    router = matmul_s(c, xp, routed_tokens, router_cols, h, high_precision=True)   # a BF16 GEMM under any recipe
    scores = routed_tokens * E
    r = 4.0 if c.model.router_fp32 else e                   # a float32 router's logits and scores
    router_eltwise = (eltwise_s(c, xp, scores, SOFTMAX_FLOPS_PER_ELEM, 2 * r)
                      + eltwise_s(c, xp, scores, TOPK_FLOPS_PER_ELEM, r))

    # Up and down GEMMs of the local experts: one grouped kernel each, or plain GEMMs for one expert.
    grouped = grouped_gemm_s(c, xp, local, rows, up_cols, h) + grouped_gemm_s(c, xp, local, rows, h, f_cols)
    single = matmul_s(c, xp, rows, up_cols, h) + matmul_s(c, xp, rows, h, f_cols)
    experts = xp.where(local > 1, grouped, single)
    expert_elems = local * rows * f_cols
    if c.model.gated_mlp:
        expert_act = eltwise_s(c, xp, expert_elems, act_flops, 3 * e)        # reads both halves, writes one
    else:
        expert_act = 0.0 if c.settings.fused_activation else eltwise_s(c, xp, expert_elems, act_flops, 2 * e)

    # Permute copies each routed row (read + write); unpermute reads the k outputs of a token and
    # writes their weighted sum; with several local experts the gathered rows are sorted by
    # expert before the GEMMs and back after them (Megatron's sort_chunks_by_idxs).
    routed_elems = routed_tokens * k * h
    gathered_elems = local * rows * h
    permutations = permutation_s(c, xp, routed_elems, gathered_elems, local)

    if c.model.shared_feedforward:
        s_cols = c.model.shared_feedforward / tp
        s_up = 2 * s_cols if c.model.gated_mlp else s_cols
        shared = matmul_s(c, xp, tokens, s_up, h) + matmul_s(c, xp, tokens, h, s_cols)
        if c.model.gated_mlp:
            shared_act = eltwise_s(c, xp, tokens * s_cols, act_flops, 3 * e)
        else:
            shared_act = 0.0 if c.settings.fused_activation else eltwise_s(c, xp, tokens * s_cols, act_flops, 2 * e)
        shared_flops = 2 * tokens * h * (s_up + s_cols)
    else:
        shared, shared_act, shared_flops = 0.0, 0.0, 0.0

    # backward's weight gradients where the recipe times them at their own shape (else None):
    # the router's as its forward, the experts' grouped or one GEMM each as forward, the shared experts'
    expert_shapes = ((rows, up_cols, h), (rows, h, f_cols))
    weight_grads = weight_grad_s(c, xp, expert_shapes, local)
    if weight_grads is not None:
        experts_weight_grads = xp.where(local > 1, weight_grads, weight_grad_s(c, xp, expert_shapes))
        shared_weight_grads = (weight_grad_s(c, xp, ((tokens, s_up, h), (tokens, h, s_cols)))
                               if c.model.shared_feedforward else 0.0)
        weight_grads = router + experts_weight_grads + shared_weight_grads
    launches = moe_launches(c, xp, local)
    extra_forward, extra_backward = (num_bytes / c.memory.hbm_bytes_per_s for num_bytes in router_extra_bytes(c, routed_tokens))
    router_eltwise = router_eltwise + extra_forward   # the launches' latency is in launches.forward_s
    expert_act = expert_act + launches.activation_s
    return MoeLayerForward(
        router_gemm_s=router, expert_gemm_s=experts, shared_gemm_s=shared,
        eltwise_s=router_eltwise + expert_act + permutations + shared_act + launches.forward_s - launches.activation_s,
        matrix_flops=(2 * routed_tokens * h * router_cols + 2 * local * rows * h * (up_cols + f_cols)
                      + shared_flops),
        local_experts=local, rows_per_expert=rows, expert_activation_s=expert_act,
        router_eltwise_s=router_eltwise, permute_s=permutations, shared_activation_s=shared_act,
        launches_s=launches.forward_s - launches.activation_s, weight_grad_s=weight_grads,
        launches_backward_extra_s=(launches.backward_extra_s + extra_backward - 2 * extra_forward
                                   + fp32_router_backward_s(c, xp, routed_tokens, router_cols, router)),
    )


def moe_quantized_gemms(c: Context, tokens, tp, ep, etp) -> tuple[GemmOperands, ...]:
    """The operands of one MoE layer a precision recipe quantizes (costmodel.terms.quantize): the
    experts' grouped GEMMs on the rows they receive (after the BF16 dispatch and gather), and
    the shared experts as a dense MLP whose input is gathered under sequence parallelism (the
    router stays BF16)."""
    local, rows, h = c.model.experts / ep, expert_rows(c, tokens, tp, ep, etp), c.model.hidden
    f_cols = c.model.expert_feedforward / etp
    up_cols = 2 * f_cols if c.model.gated_mlp else f_cols
    gemms = (GemmOperands(local * rows * h, local * rows * up_cols, local * h * up_cols),
             GemmOperands(local * rows * f_cols, local * rows * h, local * f_cols * h))
    if c.model.shared_feedforward:
        s_cols = c.model.shared_feedforward / tp
        s_up = 2 * s_cols if c.model.gated_mlp else s_cols
        gemms += (GemmOperands(tokens / tp * h, tokens * s_up, h * s_up, tp > 1, False, tp),
                  GemmOperands(tokens * s_cols, tokens / tp * h, s_cols * h, False, tp > 1, tp))
    return gemms


@dataclass(frozen=True)
class MoeCommunication:
    """The MoE layer's collectives in one pass (forward; backward repeats each once), one GPU."""

    dispatch_s: object
    """all-to-all of the routed rows among the ep GPUs (network `ep_net`)"""
    combine_s: object
    """all-to-all of the expert outputs back (the same volume)"""
    tp_gather_s: object
    """all-gather of the received rows among the etp GPUs (network `etp_net`; 0 at etp 1)"""
    tp_scatter_s: object
    """reduce-scatter of the expert outputs' partial sums among the etp GPUs"""
    all_to_all_bytes: object
    """one all-to-all's message per GPU, e·(T/t)·k·c·h; (ep-1)/ep of it crosses the network"""

    @property
    def per_pass_s(self):
        return self.dispatch_s + self.combine_s + self.tp_gather_s + self.tp_scatter_s


def distinct_destinations(xp, group, k):
    """Expected distinct members of a group of `group` equal parts that a token's k experts
    land in, routed uniformly (force-balanced routing): group·(1 − (1 − 1/group)^k)."""
    return group * (1.0 - (1.0 - 1.0 / group) ** k)


def flex_dispatch_s(c: Context, xp, tokens, tp, ep, etp, ep_net):
    """One dispatch (or combine) of the flex dispatcher (DeepEP / HybridEP), one GPU.

    DeepEP sends a token once to each GPU that holds one of its k experts, not once per expert
    (deepseek-ai/DeepEP README: intranode dispatch over NVLink; internode, once to each node
    over RDMA, then forwarded over NVLink inside it), the RDMA and NVLink stages pipelined.
    With the ep·etp GPUs of the expert group over `nodes` domains of the innermost network
    (nodes = ep·etp / the domain's size, at least 1) and uniform routing:
        NVLink: e·(T/t)·h·c · D(ep, k)·(ep-1)/ep      D(n, k) = n·(1 − (1 − 1/n)^k)
        RDMA:   e·(T/t)·h·c · D(nodes, k)·(nodes-1)/nodes
        time  = latency + max(NVLink bytes / inner rate, RDMA bytes / rate of `ep_net`)
    (c the capacity factor, as the all-to-all's). HybridEP on an NVL72 rack keeps the whole
    group on NVLink (nodes = 1): only the deduplication counts there."""
    e, h, k = c.precision.elem_bytes, c.model.hidden, c.model.experts_per_token
    row = e * tokens / tp * h * c.settings.capacity_factor
    domain = c.net.size[0]
    nodes = xp.maximum(1.0, ep * etp / domain)
    nvlink = row * distinct_destinations(xp, ep, k) * (ep - 1) / ep
    rdma = row * distinct_destinations(xp, nodes, k) * (nodes - 1) / nodes
    wire = xp.maximum(nvlink / c.net.bytes_per_s[0], rdma / xp.pick(c.net.bytes_per_s, ep_net))
    return xp.where(ep > 1, xp.pick(c.net.latency_s, ep_net) + wire, 0.0)


def moe_communication(c: Context, xp, tokens, tp, ep, etp, ep_net, etp_net) -> MoeCommunication:
    """Token dispatch and combine (Megatron-LM's all-to-all dispatcher, or the flex dispatcher:
    `flex_dispatch_s`): each GPU sends its
    (T/t)·k routed rows of h elements — c times as many at the busiest receiver — to the ep
    GPUs holding their experts, ep-1 of ep parts over the network carrying ep (its group
    spans etp·ep GPUs: Collective.all_to_all, [1, -1]); with etp > 1 the rows received by an
    expert tensor-parallel group are all-gathered before the expert GEMMs and their partial
    sums reduce-scattered after (message (T/t)·k·c·h·x per GPU, on the network carrying etp)."""
    e, h, k = c.precision.elem_bytes, c.model.hidden, c.model.experts_per_token
    message = e * tokens / tp * k * c.settings.capacity_factor * h
    if c.settings.moe_flex_dispatcher:
        all_to_all = flex_dispatch_s(c, xp, tokens, tp, ep, etp, ep_net)
    else:
        all_to_all = collective_s(c, xp, Collective.all_to_all, ep, message, ep_net)
    gathered = message * etp
    return MoeCommunication(
        dispatch_s=all_to_all, combine_s=all_to_all,
        tp_gather_s=collective_s(c, xp, Collective.all_gather, etp, gathered, etp_net),
        tp_scatter_s=collective_s(c, xp, Collective.reduce_scatter, etp, gathered, etp_net),
        all_to_all_bytes=message,
    )


@dataclass(frozen=True)
class MoeMemory:
    """What one MoE layer holds on one GPU: its parameters (count; the block's datatype, gradient
    and optimizer bytes per parameter apply) and activation bytes for one microbatch."""

    routed_params: object
    """the E/p local experts, each split etp ways: routed expert parameters / (ep·etp)"""
    shared_params: object
    """the shared experts, split tp ways"""
    router_params: object
    """the router (and shared-expert gate), whole on every GPU"""
    router_probs_bytes: object
    """kept for backward: the softmax of the (T/t) × E router scores"""
    expert_input_bytes: object
    """kept: the gathered rows the local experts multiply, E/p · r × h"""
    expert_intermediate_bytes: object
    """kept: the up-projection output and the activation output, 2 (gated 3) · E/p · r × f_e/x"""
    combine_input_bytes: object
    """kept: the k expert outputs per routed token that unpermute weights, (T/t)·k × h"""
    shared_intermediate_bytes: object
    """kept: the shared experts' intermediates, 2 (gated 3) · T × f_s/t"""
    all_to_all_buffer_bytes: object
    """transient while the layer runs: one all-to-all's send and receive buffers"""

    @property
    def params(self):
        return self.routed_params + self.shared_params + self.router_params

    @property
    def stored_bytes(self):
        """Activations kept from forward to backward, in place of a dense MLP's intermediates
        (the layer's input, the second norm's output, is the block's, as for a dense MLP)."""
        return (self.router_probs_bytes + self.expert_input_bytes + self.expert_intermediate_bytes
                + self.combine_input_bytes + self.shared_intermediate_bytes)


def moe_memory(c: Context, xp, tokens, tp, ep, etp) -> MoeMemory:
    """Parameters and activation bytes of one MoE layer on one GPU (Korthikanti et al. 2022 §4's
    accounting applied to the layers above: every GEMM input and activation input is kept)."""
    e, h, k = c.precision.elem_bytes, c.model.hidden, c.model.experts_per_token
    local = c.model.experts / ep
    rows = expert_rows(c, tokens, tp, ep, etp)
    intermediates = 3 if c.model.gated_mlp else 2            # as block.py: gated keeps h→2f_e output and the gate's
    return MoeMemory(
        routed_params=c.model.routed_expert_params / (ep * etp),
        shared_params=c.model.shared_expert_params / tp,
        router_params=c.model.router_params,
        router_probs_bytes=e * tokens / tp * c.model.experts,
        expert_input_bytes=e * local * rows * h,
        expert_intermediate_bytes=intermediates * e * local * rows * c.model.expert_feedforward / etp,
        combine_input_bytes=e * tokens / tp * k * h,
        shared_intermediate_bytes=intermediates * e * tokens * c.model.shared_feedforward / tp,
        all_to_all_buffer_bytes=2 * e * tokens / tp * k * c.settings.capacity_factor * h,
    )
