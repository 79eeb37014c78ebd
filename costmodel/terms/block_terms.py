"""One transformer block in one iteration: compute, the exposed tensor-, context- and
expert-parallel communication, recomputation and offload traffic of one block and one
microbatch on one GPU, for each kind of block (costmodel.terms.block.BLOCK_KINDS): a stage sums
its own blocks by kind (costmodel.terms.stage_kinds).

Written against costmodel.ops: `m` may hold scalars (one mapping) or numpy arrays (many).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace

from costmodel.terms.block import BlockForward, block_forward_times, has_experts
from costmodel.terms.block_memory import StoredActivations, block_stored
from costmodel.terms.block_offload import offload_exposed
from costmodel.terms.comm import collective_s, overlapped, tp_overlap_terms
from costmodel.terms.context import Context
from costmodel.terms.memory_features import offload_share, recompute_share, with_switches
from costmodel.terms.moe import moe_communication
from costmodel.inputs.system import Collective

AMAX_BYTES = 4.0
"""One fp32 amax per quantized tensor (per-tensor current scaling; NVFP4's per-tensor scale)."""


FORWARD_READS = ("tp", "cp", "ep", "etp", "microbatch", "seq_par", "recompute_modules", "cp_comm_a2a")
"""What block_forward_times reads of a mapping (its compute does not depend on the networks,
overlaps, offloads or recompute setting: a grid of those computes it once per distinct
combination of these, ArrayOps.per_distinct)."""


@dataclass(frozen=True)
class BlockTerms:
    """One block, one microbatch, one GPU (seconds, bytes; each a scalar or an array)."""

    forward: BlockForward
    compute_fwd_s: object
    compute_bwd_s: object
    tp_fwd_s: object
    """TP communication in forward, exposed plus the compute it steals while overlapping"""
    tp_bwd_s: object
    cp_fwd_s: object
    """context-parallel communication in forward (cp_comm: the K/V ring, the K/V all-gather or
    the all-to-alls), exposed plus the compute it steals"""
    cp_bwd_s: object
    ep_fwd_s: object
    """an MoE block's token dispatch and combine all-to-alls in forward, exposed (0 when dense)"""
    ep_bwd_s: object
    ep_unpaired_s: object
    """with moe_comm_overlap: what one forward and one backward of this block without a partner
    microbatch add over their overlapped cost (their dispatch and combine run exposed:
    2·(ep_pass_s − the overlapped per-pass time); 0 without overlap or when dense)"""
    block_fwd_s: object
    """compute + TP, CP and EP communication, forward"""
    block_bwd_s: object
    recompute_s: object
    act_message_bytes: object
    """one activation tensor (microbatch · seq · hidden elements)"""
    activations: StoredActivations
    offload_fwd_s: object
    """offload traffic compute cannot hide, forward"""
    offload_bwd_s: object
    offload_bytes_per_s_needed: object
    """offload bandwidth that would hide all of this block's traffic"""

    @property
    def weight_grad_gemm_s(self):
        """The block's weight-gradient kernels (ZB-H1's W pass; costmodel.terms.layers)."""
        return self.forward.weight_grad_s


def cp_ring_terms(c: Context, m, xp, fw: BlockForward):
    """The context-parallel K/V ring of one block, forward and backward: exposed time and
    the compute it steals, each. Forward passes this GPU's K and V chunk (b·s/cp tokens ×
    2·g·d/tp columns) cp-1 steps around the ring; backward passes K and V again and their
    gradients back (twice the bytes). Each step's transfer overlaps the attention core of
    the step (Megatron-LM / TransformerEngine run them on separate streams), so only the
    excess over the core is exposed, and the hidden part takes the network's compute usage."""
    step = collective_s(c, xp, Collective.p2p, m.cp, kv_chunk_bytes(c, m), m.cp_net)
    ring_fwd = (m.cp - 1) * step
    usage = xp.pick(c.net.usage, m.cp_net)
    fwd_exposed, fwd_stolen = overlapped(ring_fwd, fw.attention_core_s, 1.0, usage, xp)
    bwd_exposed, bwd_stolen = overlapped(2 * ring_fwd, 2 * fw.attention_core_s + fw.kernel_recompute_s, 1.0, usage, xp)
    return fwd_exposed + fwd_stolen, bwd_exposed + bwd_stolen


def ep_overlap_terms(c: Context, m, xp, ep_pass_s, compute_fwd_s, compute_bwd_s):
    """(forward, backward) expert-parallel time of one MoE block, exposed plus the compute
    it steals. Without overlap each pass runs its dispatch and combine on the compute stream:
    `ep_pass_s` each. With Megatron-LM's overlap_moe_expert_parallel_comm (and
    delay_wgrad_compute; megatron/core/pipeline_parallel/combined_1f1b.py) one microbatch's
    forward runs beside another's backward, each one's dispatch and combine on the
    communication stream while the other computes: the 2·ep_pass_s of a forward-backward pair
    hide behind at most the pair's compute (comm.overlapped, hidden fraction 1), taking the
    GPU's SMs the communication kernels hold while hidden; the exposed rest is split by pass.
    With the flex dispatcher that is the SMs DeepEP / HybridEP were given over the GPU's
    (Context.settings.moe_dispatcher_sm_share: DeepEP's and HybridEP's kernels run on a fixed number of
    SMs whatever the network, NVLink or RDMA), else the network's processor_usage (NCCL's).
    The passes without a partner (the schedule's warm-up forwards and cool-down backwards)
    run ep_pass_s each: `ep_unpaired_s` and costmodel.terms.iteration."""
    if not c.settings.moe_comm_overlap:
        return ep_pass_s, ep_pass_s
    usage = xp.pick(c.net.usage, m.ep_net) if c.settings.moe_dispatcher_sm_share is None else c.settings.moe_dispatcher_sm_share
    exposed, stolen = overlapped(2 * ep_pass_s, compute_fwd_s + compute_bwd_s, 1.0, usage, xp)
    per_pass = (exposed + stolen) / 2
    return per_pass, per_pass


def kv_chunk_bytes(c: Context, m):
    """This GPU's K and V: b·s/cp tokens × 2·g·d/tp columns (latent attention: keys of d_qk
    and values of d_v, one per head)."""
    if c.model.latent:
        return c.precision.elem_bytes * m.microbatch * c.model.seq / m.cp * c.model.kv_width / m.tp
    return c.precision.elem_bytes * m.microbatch * c.model.seq / m.cp * 2 * c.model.kv_heads / m.tp * c.model.head_size


def cp_all_gather_terms(c: Context, m, xp):
    """K and V all-gathered over the cp group before the core, exposed (TransformerEngine
    AttnFuncWithCPAndKVAllGather, "KV all-gather between CP ranks is exposed"; Llama 3, Dubey
    et al. 2024 §3.3.2), one collective each: forward gathers K and V; backward gathers them
    again (only the local chunks are saved) and reduce-scatters dK and dV. Each message is the
    gathered tensor, cp chunks."""
    half = m.cp * kv_chunk_bytes(c, m) / 2                 # K or V of the whole sequence
    gather = collective_s(c, xp, Collective.all_gather, m.cp, half, m.cp_net)
    scatter = collective_s(c, xp, Collective.reduce_scatter, m.cp, half, m.cp_net)
    return 2 * gather, 2 * gather + 2 * scatter


def cp_a2a_terms(c: Context, m, xp):
    """DeepSpeed-Ulysses (TransformerEngine AttnFuncWithCPAndQKVOA2A; Jacobs et al. 2023):
    all-to-alls over the cp group re-shard Q, K and V from the sequence to the heads before the
    core and the output back after it, on the compute stream: 4 forward (Q, K, V, O) and 4
    backward (dO, dQ, dK, dV), each this GPU's tensor of b·s/cp tokens."""
    tokens = m.microbatch * c.model.seq / m.cp
    heads = c.model.heads / m.tp
    q_cols = heads * c.model.head_size
    out_cols = heads * c.model.value_head_size if c.model.latent else q_cols
    kv = kv_chunk_bytes(c, m) / 2
    pieces = (c.precision.elem_bytes * tokens * q_cols, kv, kv, c.precision.elem_bytes * tokens * out_cols)
    total = 0.0
    for message in pieces:
        total = total + collective_s(c, xp, Collective.all_to_all, m.cp, message, m.cp_net)
    return total, total


def cp_comm_terms(c: Context, m, xp, fw: BlockForward):
    """Context-parallel communication of one block, forward and backward, by `cp_comm`: the
    p2p ring (cp_ring_terms), all_gather (cp_all_gather_terms) or a2a (cp_a2a_terms); 0 when
    cp = 1 (collective_s of a group of one)."""
    ring_fwd, ring_bwd = cp_ring_terms(c, m, xp, fw)
    gather_fwd, gather_bwd = cp_all_gather_terms(c, m, xp)
    a2a_fwd, a2a_bwd = cp_a2a_terms(c, m, xp)
    fwd = xp.where(m.cp_comm_all_gather, gather_fwd, xp.where(m.cp_comm_a2a, a2a_fwd, ring_fwd))
    bwd = xp.where(m.cp_comm_all_gather, gather_bwd, xp.where(m.cp_comm_a2a, a2a_bwd, ring_bwd))
    return fwd, bwd


@dataclass(frozen=True)
class TpTerms:
    """One block's tensor-parallel communication, forward and backward."""

    fwd_s: object
    """the regions' collectives, exposed plus the compute they steal while overlapping"""
    bwd_s: object
    exposed_s: object
    """what runs exposed each way: current scaling's amax all-reduces"""


def tp_terms(c: Context, m, xp, fw: BlockForward) -> TpTerms:
    """The tensor-parallel collectives of one block's parallel regions (its layers'
    `tp_regions`: attention and MLP; an MoE layer keeps the MLP region's only around its shared
    experts, and gathers and scatters its routed rows instead: costmodel.terms.moe), overlapped
    with the block's GEMMs as the mapping's tp_overlap allows
    (costmodel.terms.comm.tp_overlap_terms)."""
    act_message = c.precision.elem_bytes * m.microbatch * c.model.seq / m.cp * c.model.hidden
    # Under a quantized recipe the sequence-parallel gathers carry the quantized GEMM input
    # (forward; the output gradient in backward), the reduce-scatters BF16.
    gather_message = act_message / c.precision.elem_bytes * c.precision.recipe.copy_bytes if c.precision.quantized else None
    region_s, hidden_fraction, gather_s = tp_overlap_terms(c, m, xp, act_message, gather_message)
    tp_usage = xp.pick(c.net.usage, m.tp_net)
    redo_gather = m.seq_par & m.seq_par_ag_redo & xp.logical_not(m.recompute_full)
    regions = fw.tp_regions
    tp_fwd = regions * region_s
    tp_bwd = regions * region_s + xp.where(redo_gather, 2 * gather_s, 0.0)
    tp_fwd_exposed, tp_fwd_stolen = overlapped(tp_fwd, fw.gemm_s, hidden_fraction, tp_usage, xp)
    tp_bwd_exposed, tp_bwd_stolen = overlapped(tp_bwd, 2 * fw.gemm_s, hidden_fraction, tp_usage, xp)
    exposed_tp = 0.0
    if c.precision.quantized and c.precision.recipe.format.amax_pass:
        # A sequence-parallel operand under current scaling reduces its amax over the tp group
        # before its cast, a blocking all-reduce of one fp32 (TE csrc/quantizer.cpp,
        # amax_reduction_group->allreduce(...)->wait(); module/linear.py sets the group for a
        # column-parallel input and a row-parallel output gradient): one per region each way.
        amax = collective_s(c, xp, Collective.all_reduce, m.tp, AMAX_BYTES, m.tp_net)
        exposed_tp = xp.where(m.seq_par, regions * amax, 0.0)
    return TpTerms(fwd_s=tp_fwd_exposed + tp_fwd_stolen, bwd_s=tp_bwd_exposed + tp_bwd_stolen, exposed_s=exposed_tp)


def kind_forward(c: Context, m, xp, kind: str) -> BlockForward:
    """The forward of one block of one kind (costmodel.terms.block.BLOCK_KINDS: "dense", or
    "moe" with the MoE layer in the MLP's place): the sum of its layers' records, once per
    distinct combination of FORWARD_READS."""
    return xp.per_distinct(lambda v: block_forward_times(c, v, xp, kind), m, FORWARD_READS)


def kind_terms(c: Context, m, xp, kind: str, forward: BlockForward | None = None) -> BlockTerms:
    """One block of one kind (costmodel.terms.block.BLOCK_KINDS), one microbatch, one GPU:
    compute, exposed TP, CP and EP communication (with the compute they steal),
    recomputation and the offload traffic compute cannot hide, in seconds; and the block's
    stored activations. Reads tp, cp, ep, microbatch and the flags. `forward`: the kind's
    forward (kind_forward) when the caller has it: the mixes of block_terms change only
    switches the forward does not read."""
    fw = kind_forward(c, m, xp, kind) if forward is None else forward
    moe = has_experts(kind)
    # Backward: the layers' activation- and weight-gradient kernels (costmodel.terms.layers); a
    # precision recipe's quantization passes differ by direction (inputs forward, output
    # gradients backward).
    compute_fwd = fw.gemm_s + fw.eltwise_s + fw.quantize_fwd_s
    compute_bwd = fw.backward_s + fw.quantize_bwd_s

    tp = tp_terms(c, m, xp, fw)
    cp_fwd, cp_bwd = cp_comm_terms(c, m, xp, fw)
    exposed_tp = tp.exposed_s
    ep_fwd, ep_bwd, ep_unpaired = 0.0, 0.0, 0.0
    if moe:
        # Megatron-LM's dispatchers run on the compute stream between the router and the
        # experts (token_dispatcher.py): nothing hides them unless the run overlaps them with
        # another microbatch (ep_overlap_terms). Backward repeats each collective once (a
        # dispatch's gradient is a combine).
        comm = moe_communication(c, xp, m.microbatch * c.model.seq / m.cp, m.tp, m.ep, m.etp, m.ep_net, m.etp_net)
        exposed_tp = exposed_tp + comm.tp_gather_s + comm.tp_scatter_s
        ep_pass = comm.dispatch_s + comm.combine_s
        ep_fwd, ep_bwd = ep_overlap_terms(c, m, xp, ep_pass, compute_fwd, compute_bwd)
        ep_unpaired = 2 * ep_pass - ep_fwd - ep_bwd
    block_fwd = compute_fwd + tp.fwd_s + exposed_tp + cp_fwd + ep_fwd
    block_bwd = compute_bwd + tp.bwd_s + exposed_tp + cp_bwd + ep_bwd
    # Full: the whole block forward again; attn_only: the (unfused) attention core; and a fused
    # attention kernel's backward redoes its scores whatever the setting.
    recompute = fw.kernel_recompute_s + xp.where(m.recompute_full, block_fwd,
                                                    xp.where(m.recompute_attn_only, fw.selective_recompute_s, 0.0))

    act = block_stored(c, m, xp, fw)     # the layers' records under the mapping's recompute setting
    offload_fwd, offload_bwd, offload_needed = offload_exposed(c, m, xp, kind, act, block_fwd, block_bwd + recompute)
    return BlockTerms(
        forward=fw,
        compute_fwd_s=compute_fwd,
        compute_bwd_s=compute_bwd,
        tp_fwd_s=tp.fwd_s + exposed_tp,
        tp_bwd_s=tp.bwd_s + exposed_tp,
        cp_fwd_s=cp_fwd,
        cp_bwd_s=cp_bwd,
        ep_fwd_s=ep_fwd,
        ep_bwd_s=ep_bwd,
        ep_unpaired_s=ep_unpaired,
        block_fwd_s=block_fwd,
        block_bwd_s=block_bwd,
        recompute_s=recompute,
        act_message_bytes=c.precision.elem_bytes * m.microbatch * c.model.seq / m.cp * c.model.hidden,
        activations=act,
        offload_fwd_s=offload_fwd,
        offload_bwd_s=offload_bwd,
        offload_bytes_per_s_needed=offload_needed,
    )


def mix_terms(dense, moe, share):
    """(1 - share)·dense + share·moe, field by field (nested results too); a block's layers are
    both kinds' records, each weighted by its kind's share (their sum is the mixed block)."""
    if is_dataclass(dense):
        return type(dense)(**{f.name: (_weighted_layers(dense.layers, moe.layers, share) if f.name == "layers"
                                       else mix_terms(getattr(dense, f.name), getattr(moe, f.name), share))
                              for f in fields(dense)})
    if isinstance(dense, (str, tuple)):          # a record's name, modules and operands: not mixed
        return dense
    return (1 - share) * dense + share * moe


def _weighted_layers(first: tuple, second: tuple, share) -> tuple:
    """The records of two mixed blocks, the first weighted by 1 - share and the second by share."""
    return (tuple(layer.scaled(1 - share) for layer in first)
            + tuple(layer.scaled(share) for layer in second))


class _KindForwards:
    """Each block kind's forward (dense or MoE; a recipe's quantized or BF16 blocks), computed
    once per evaluation whatever block_terms mixes (recompute and offload switches, which the
    forward does not read)."""

    def __init__(self, m, xp):
        self.m, self.xp, self.done = m, xp, {}

    def terms(self, c: Context, m, kind: str, bf16: bool) -> BlockTerms:
        key = (kind, bf16)
        if key not in self.done:
            self.done[key] = kind_forward(c, self.m, self.xp, kind)
        return kind_terms(c, m, self.xp, kind, self.done[key])


@dataclass(frozen=True)
class KindBlocks:
    """One block of each of the model's kinds (Context.model.block_kinds' order), one microbatch,
    one GPU, and `mean`, their mean over the model's blocks (the search's floors read it; a
    stage sums its own blocks, costmodel.terms.stage_kinds)."""

    terms: tuple
    mean: BlockTerms | None
    """(none where its caller mixes only the fields it reads: kind_block_terms' `mean`)"""
    mtp: BlockTerms | None = None
    """a multi-token prediction module's block (none of the mixes: iteration.mtp_terms), if asked"""


def block_terms(c: Context, m, xp) -> BlockTerms:
    """The mean block of the model (KindBlocks.mean)."""
    return kind_block_terms(c, m, xp).mean


def kinds_mean(c: Context, values: list):
    """The mean over the model's blocks of one value of each kind's block (Context.model.block_kinds'
    order: whole records or one of their fields), weighted by the kinds' counts and mixed kind by
    kind (mix_terms): a field of the records' mean is the mean of that field."""
    present = c.model.block_kinds
    mean, counted = values[0], present[0][1]
    for (_, count), value in zip(present[1:], values[1:]):
        counted += count
        mean = mix_terms(mean, value, count / counted)
    return mean


def kind_block_terms(c: Context, m, xp, with_mtp: bool = False, mean: bool = True) -> KindBlocks:
    """Each kind's block (kind_terms, with a mapping's recompute and offload mixes and a
    recipe's BF16 blocks), and their mean weighted by the kinds' counts; the mean's recompute
    workspace and offload bandwidth are the largest kind's. A mapping that recomputes N of each chunk's K blocks (recompute_blocks, Megatron-LM's
    recompute_method block) mixes the block recomputed in full and the block storing
    everything by N/K; one that offloads N of a stage's blocks' activations
    (activation_offload_blocks) mixes the offloading and the keeping block by N/(L/pp)
    (costmodel.terms.memory_features). The recompute workspace is the recomputed block's, and the
    offload bandwidth needed the offloading block's (peaks, not means). Each kind's forward
    is computed once (_KindForwards) and every mix reuses it. `with_mtp`: also a multi-token
    prediction module's block (KindBlocks.mtp) when the model has them. Without `mean`, the mean
    of several kinds is left to the caller (kinds_mean of the fields it reads)."""
    kinds = _KindForwards(m, xp)
    terms = tuple(_recompute_mixed(c, m, kinds, kind) for kind, _ in c.model.block_kinds)
    mtp = kinds.terms(c, m, c.model.mtp_kind, False) if with_mtp and c.model.mtp_blocks else None
    if len(terms) > 1 and not mean:
        return KindBlocks(terms, None, mtp)
    mean = kinds_mean(c, terms)
    if len(terms) > 1:
        workspace, needed = terms[0].activations.workspace, terms[0].offload_bytes_per_s_needed
        for kind_block in terms[1:]:
            workspace = xp.maximum(workspace, kind_block.activations.workspace)
            needed = xp.maximum(needed, kind_block.offload_bytes_per_s_needed)
        mean = replace(mean, activations=replace(mean.activations, workspace=workspace),
                       offload_bytes_per_s_needed=needed)
    return KindBlocks(terms, mean, mtp)


def _recompute_mixed(c: Context, m, kinds: _KindForwards, kind: str) -> BlockTerms:
    """One block of `kind`, with N of each chunk's blocks recomputed when the mapping says so."""
    xp = kinds.xp
    share = recompute_share(c, m)
    if share is None:
        return _offload_mixed(c, m, kinds, kind)
    recomputed = _offload_mixed(c, with_switches(m, recompute_full=True, recompute_attn_only=False,
                                                 recompute_none=False), kinds, kind)
    stored = _offload_mixed(c, with_switches(m, recompute_full=False, recompute_attn_only=False,
                                             recompute_none=True), kinds, kind)
    mixed = mix_terms(stored, recomputed, share)
    workspace = xp.maximum(recomputed.activations.workspace, stored.activations.workspace)
    return replace(mixed, activations=replace(mixed.activations, workspace=workspace),
                   offload_bytes_per_s_needed=xp.maximum(recomputed.offload_bytes_per_s_needed,
                                                         stored.offload_bytes_per_s_needed))


def _offload_mixed(c: Context, m, kinds: _KindForwards, kind: str) -> BlockTerms:
    """One block of `kind` with N of a stage's blocks offloading their activations when the
    mapping says so."""
    share = offload_share(c, m)
    if share is None:
        return _precision_mixed(c, m, kinds, kind)
    offloading = _precision_mixed(c, m, kinds, kind)
    mixed = mix_terms(_precision_mixed(c, with_switches(m, activations_offload=False), kinds, kind), offloading, share)
    return replace(mixed, offload_bytes_per_s_needed=offloading.offload_bytes_per_s_needed)


def _precision_mixed(c: Context, m, kinds: _KindForwards, kind: str) -> BlockTerms:
    """One block of `kind`, mixed with its BF16 copy by the share of the model's blocks a
    recipe keeps in BF16 (the first and last N: a model-wide share, not the stages that hold them)."""
    if c.precision.quantized and c.precision.recipe.bf16_block_share:
        return mix_terms(kinds.terms(c, m, kind, False), kinds.terms(c.bf16_blocks(), m, kind, True),
                    c.precision.recipe.bf16_block_share)
    return kinds.terms(c, m, kind, False)
