"""Data parallelism: how ZeRO shards a stage's state, the gradient reduction of the stage's
parameters and how much of it compute hides, and the optimizer step over this GPU's share.

Written against the backend interface of costmodel.ops, so `m` may hold scalars (one
mapping) or numpy arrays (many), as the other formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.block_offload import offload_rate
from costmodel.terms.block_terms import BlockTerms
from costmodel.terms.comm import collective_s, overlapped
from costmodel.terms.context import Context
from costmodel.terms.layer_time import eltwise_s
from costmodel.terms.pipeline_time import Stages
from costmodel.terms.stage_costs import StageBlocks, StageMean, pick
from costmodel.terms.step_terms import OPTIMIZER_KERNELS
from costmodel.inputs.system import Collective

# FLOP per parameter of an Adam step (moment updates, bias correction, square root, divide,
# weight decay, update): about 12 element-wise operations.
ADAM_FLOPS_PER_PARAM = 12.0


@dataclass(frozen=True)
class Sharding:
    """What the ZeRO stage shards, and over which GPUs (Rajbhandari et al. 2020 §5, §7).

    With context parallelism the cp GPUs of a replica hold the same weights and each has
    gradients from its share of the sequence: gradients are reduced, and ZeRO shards, over
    dp·cp GPUs (Megatron-LM's data-parallel group with context parallelism,
    parallel_state.get_data_parallel_group(with_context_parallel=True)). That group leaves
    the replica (and travels on dp's network) when dp > 1, else it is the cp group itself.
    MoE experts (MoE parallel folding): a stage's tp·cp·dp GPUs regroup into etp × ep × edp
    for the expert layers, so the experts' gradients are reduced and sharded over the edp =
    tp·cp·dp/(ep·etp) GPUs holding the same expert shard (Megatron-LM's expert data-parallel
    group, parallel_state.get_expert_data_parallel_group; expert_data_parallel_size =
    world/(etp·ep·pp)). That group lies within the stage's tp·cp·dp GPUs, so it travels on
    the network of the innermost dense group spanning them: dp's when dp > 1, else cp's,
    else tp's (with dp = cp = 1 only the experts have anything to reduce)."""

    optimizer: object
    """optimizer state sharded (stage >= 1)"""
    grads: object
    """gradients sharded (stage >= 2)"""
    weights: object
    """weights sharded (stage 3)"""
    group: object
    """dp·cp: the GPUs the gradients are reduced and the state sharded over"""
    expert_group: object
    """edp = tp·cp·dp/(ep·etp): the same for the experts"""
    net: object
    """the network the gradient reduction travels on"""
    shard: object = None
    """the shard group (hybrid sharding, `shard`): the inner GPUs of dp·cp the dense state is
    sharded over, replicated across group/shard of them; dp·cp without hybrid sharding"""

    @staticmethod
    def of(m, xp) -> "Sharding":
        group = m.dp * m.cp
        return Sharding(xp.logical_not(m.zero_0), m.zero_2 | m.zero_3, m.zero_3, group,
                        m.tp * group / (m.ep * m.etp),
                        xp.where(m.dp > 1, m.dp_net, xp.where(m.cp > 1, m.cp_net, m.tp_net)), m.shard)

    def shards(self, xp) -> tuple:
        """(weights, gradients, optimizer): the GPUs each is split over (1: not sharded), the
        shard group's under hybrid sharding."""
        return tuple(xp.where(sharded, self.shard, 1.0) for sharded in (self.weights, self.grads, self.optimizer))

    def expert_shards(self, xp) -> tuple:
        """The same for the experts' state, over the expert data-parallel group."""
        return tuple(xp.where(sharded, self.expert_group, 1.0)
                     for sharded in (self.weights, self.grads, self.optimizer))


@dataclass(frozen=True)
class StageParams:
    """The parameters of the stage with the most (it sets the reduction and the optimizer
    step), on one GPU."""

    dense: object
    """the non-expert parameters (tp splits them)"""
    experts: object
    """the expert parameters (etp and ep split them)"""
    blocks: object
    """the blocks of that stage"""
    output_matrix: object
    """the output layer's V·h weights a stage holds (0 when tied and pp = 1)"""
    blocks_dense: object = 0.0
    """the non-expert parameters of its blocks (`dense` less the embeddings and output layer)"""
    block: BlockTerms | StageMean | None = None
    """the mean of its blocks (costmodel.terms.stage_costs)"""


def stage_params(c: Context, m, xp, stages: Stages, sb: StageBlocks, mtp=None) -> StageParams:
    """Each stage reduces and steps its own parameters (first: its blocks and the embeddings;
    middle: its blocks; last: its blocks and the output layer; all of them when pp = 1).

    The output layer's V·h/tp weights: its own when untied; when tied, a copy on the last
    stage if that is not the first (Megatron-LM keeps one and all-reduces its gradient with
    the embedding's), none when pp = 1."""
    p, t = m.pp, m.tp
    output_matrix = xp.where(p > 1, c.model.output_layer_params, 0.0 if c.model.tied_embeddings else c.model.output_layer_params)
    first_extra = c.model.embedding_params + xp.where(p == 1, output_matrix, 0.0)
    last_extra = output_matrix + xp.where(p == 1, c.model.embedding_params, 0.0)
    if mtp is not None:
        # Multi-token prediction (costmodel.terms.iteration.mtp_terms): the modules' parameters, all
        # reduced with the dense ones (their experts' smaller expert-data-parallel group is not
        # modelled), and a copy of the embedding on the last stage when it is not the first.
        last_extra = (last_extra + (mtp.dense_params + mtp.expert_params) * t
                      + xp.where(p > 1, c.model.embedding_params, 0.0))
    if stages.equal and sb.uniform:           # the blocks and the larger of the two extras
        stage = sb.first
        dense = stage.blocks * stage.dense_params + xp.maximum(first_extra, last_extra) / t
    else:
        # each stage's own blocks: the first, every distinct middle one, the last
        stage = sb.first
        dense = stage.blocks * stage.dense_params + first_extra / t
        for middle in sb.middles:
            middle_params = middle.blocks * middle.dense_params
            stage = pick(xp, middle_params > dense, middle, stage)
            dense = xp.maximum(dense, middle_params)
        last_params = sb.last.blocks * sb.last.dense_params + last_extra / t
        last_most = last_params >= dense
        stage = pick(xp, last_most, sb.last, stage)
        dense = xp.maximum(last_params, dense)
    return StageParams(dense, stage.blocks * stage.expert_params, stage.blocks, output_matrix,
                       stage.blocks * stage.dense_params, stage.block)


@dataclass(frozen=True)
class GradientSync:
    """The gradient reduction of one iteration (s)."""

    exposed_s: object
    """what compute does not hide"""
    stolen_s: object
    """compute slowed by the GPU cores the overlapped reduction takes"""
    per_microbatch_s: object = 0.0
    """the reduction's part that repeats every microbatch (ZeRO-2's reduce-scatters, ZeRO-3's
    gathers too), before any overlap: the traffic is once-a-step part + microbatches × this"""


def gradient_sync(c: Context, m, xp, stages: Stages, sh: Sharding, params: StageParams) -> GradientSync:
    """ZeRO 0 all-reduces the gradients once; 1 reduce-scatters them and all-gathers the
    updated 16-bit weights; 2 keeps only its gradient shard, so every microbatch's gradients
    are reduce-scattered as they appear (DeepSpeed's stage 2 under gradient accumulation); 3
    also keeps only its weight shard and all-gathers each block's weights in forward and
    again in backward, every microbatch, and needs no final all-gather (each GPU updates
    only its own shard)."""
    microbatches = stages.microbatches
    scatters = xp.where(sh.grads, microbatches, 1.0)
    gathers = xp.where(sh.weights, 2 * microbatches, 1.0)

    def traffic(group, stage_params, weight_bytes, members=1.0, shard=None):
        grad_bytes = stage_params * c.precision.grad_comm_bytes
        all_reduce = collective_s(c, xp, Collective.all_reduce, group, grad_bytes, sh.net, members)
        across = 0.0
        net = sh.net
        if shard is not None:
            # hybrid sharding (costmodel/space/dimensions.py `shard`): reduce-scatter and all-gather
            # within the shard group of `shard` neighbouring members — on network 0 when the
            # group fits one of its domains —, then the shard's 1/shard of the gradients
            # all-reduced once a step over the group/shard replicas on the group's network,
            # their members shard·tp·cp·pp apart (Megatron-LM's num_distributed_optimizer_instances;
            # PyTorch FSDP's HYBRID_SHARD, _HYBRID_SHARD_ZERO2)
            replicas = group / shard
            net = xp.where((replicas > 1) & (shard <= domain_members), 0, sh.net)
            across = collective_s(c, xp, Collective.all_reduce, replicas, grad_bytes / shard, sh.net,
                                  xp.minimum(replicas, xp.floor((c.net.size[0] - 1) / (stride * shard)) + 1))
            group, members = shard, xp.minimum(shard, domain_members)
        reduce_scatter = collective_s(c, xp, Collective.reduce_scatter, group, grad_bytes, net, members)
        gather_weights = collective_s(c, xp, Collective.all_gather, group, weight_bytes, net, members)
        total = xp.where(sh.optimizer, scatters * reduce_scatter + gathers * gather_weights + across, all_reduce)
        repeated = xp.where(sh.optimizer, xp.where(sh.grads, reduce_scatter, 0.0)
                            + xp.where(sh.weights, 2 * gather_weights, 0.0), 0.0)
        return total, repeated

    # Weights travel in the datatype; under a precision recipe the blocks' as the recipe gathers
    # them (BF16, or quantized with low-precision param gather), the embeddings in BF16.
    gathered, dense_weight_bytes = c.precision.elem_bytes, c.precision.elem_bytes * params.dense
    if c.precision.quantized:
        gathered = c.precision.recipe.weight_gather_bytes
        dense_weight_bytes = c.precision.elem_bytes * (params.dense - params.blocks_dense) + gathered * params.blocks_dense
    # The group's GPUs are tp·cp·pp apart (costmodel.space.dimensions' nesting): a window of the
    # innermost domain's size (NVLink) that starts at one of them holds floor((size - 1)/(tp·cp·pp))
    # + 1 of them (costmodel.terms.comm.collective_s).
    stride = m.tp * m.cp * m.pp
    domain_members = xp.floor((c.net.size[0] - 1) / stride) + 1
    members = xp.minimum(sh.group, domain_members)
    dp_comm, per_microbatch = traffic(sh.group, params.dense, dense_weight_bytes, members, sh.shard)
    if c.model.moe_blocks:       # the experts' own reduction, on the gradient network, which spans their group
        experts, experts_per_microbatch = traffic(sh.expert_group, params.experts, gathered * params.experts)
        dp_comm, per_microbatch = dp_comm + experts, per_microbatch + experts_per_microbatch
    # Overlapped, each block's gradients reduce while the last microbatch's backward runs
    # through the blocks before it; the last block's reduction has nothing left to hide behind.
    # Stages 2 and 3 move data every microbatch, behind every microbatch's compute.
    blk = params.block
    window = xp.where(sh.grads, microbatches * params.blocks * (blk.block_fwd_s + blk.block_bwd_s + blk.recompute_s),
                      (params.blocks - 1) * (blk.block_bwd_s + blk.recompute_s))
    exposed, stolen = overlapped(dp_comm, window, xp.where(m.dp_overlap, 1.0, 0.0), xp.pick(c.net.usage, sh.net), xp)
    return GradientSync(exposed, stolen, per_microbatch)


def optimizer_step_s(c: Context, m, xp, sh: Sharding, params: StageParams):
    """The optimizer step over this GPU's share of the stage's parameters: it reads gradient
    and state and writes state and the new weights, in HBM or, offloaded, from and to the
    offload memory (the slower of the two sets the time)."""
    opt_params = (params.dense / xp.where(sh.optimizer, sh.shard, 1.0)
                  + params.experts / xp.where(sh.optimizer, sh.expert_group, 1.0))
    e, g = c.precision.elem_bytes, c.precision.grad_bytes_per_param
    # It writes each new weight in the datatype; under a precision recipe a block's as the
    # recipe keeps it (BF16, or the quantized shard and its amax read: costmodel.inputs.precision).
    written = e
    if c.precision.quantized:
        block_share = (params.blocks_dense + params.experts) / (params.dense + params.experts)
        written = e + block_share * (c.precision.recipe.optimizer_weight_bytes - e)
    opt_bytes_per_param = g + 2 * c.precision.optimizer_bytes_per_param + written
    opt_hbm_s = (eltwise_s(c, xp, opt_params, ADAM_FLOPS_PER_PARAM, opt_bytes_per_param)
                 + OPTIMIZER_KERNELS * c.step.outer_gap_extra_s)       # outside per-layer CUDA graphs
    offloaded_state = xp.where(m.optimizer_offload, c.precision.optimizer_bytes_per_param, 0.0)
    opt_off_read = (offloaded_state + xp.where(m.weight_offload, g, 0.0)) * opt_params
    opt_off_write = (offloaded_state + xp.where(m.weight_offload, e, 0.0)) * opt_params
    opt_off_bytes = xp.maximum(opt_off_read, opt_off_write)
    opt_off_s = opt_off_bytes / (offload_rate(c.memory.offload_bytes_per_s) * xp.lookup(c.memory.offload_curve, opt_off_bytes))
    return xp.maximum(opt_hbm_s, opt_off_s)
