"""Collectives as alpha-beta costs, and how much of them overlap can hide.

A collective over n GPUs on network k moving a message of B bytes takes

    latency_k + B · factor_k(op) · (n + offset_k(op)) / n / (bandwidth_k · efficiency_k)

(ring algorithms: all-reduce 2·(n-1)/n, reduce-scatter and all-gather (n-1)/n, a
point-to-point send 1), and nothing when n = 1.
"""

from __future__ import annotations

from costmodel.terms.context import Context
from costmodel.inputs.system import Collective

# 'pipe' overlap splits the GEMM next to a collective into this many chunks, each chunk's
# collective hiding behind the next chunk's compute; the first chunk stays exposed. Four
# chunks is the usual split (finer chunks pay more latency and lower GEMM efficiency).
PIPE_CHUNKS = 4.0


def collective_s(c: Context, xp, op: Collective, group, message_bytes, net, members_per_domain=1.0):
    """Time of one collective `op` among `group` GPUs on network index `net`.

    On an outer network where every GPU has its own port (`port_per_gpu`: DGX, NVL72), a group
    with `members_per_domain` > 1 of its GPUs in each domain of the innermost network (an FSDP
    group of 64 over two NVL72 racks: 32 per rack) runs its rings through the domain on the
    inner links and across domains on that many ports at once (NCCL gives each channel its own
    NIC): the bytes crossing a domain boundary share members × the outer bandwidth, every GPU
    still sends its share on the inner links, so the collective runs at min(inner, members ×
    outer); a group whose members all share one domain runs at the inner bandwidth. Never
    slower than on the outer network."""
    factor = xp.pick(c.net.factor[op], net)
    offset = xp.pick(c.net.offset[op], net)
    rate = xp.pick(c.net.bytes_per_s, net)
    inner = c.net.bytes_per_s[0]
    spread = xp.where(members_per_domain >= group, inner, xp.minimum(inner, members_per_domain * rate))
    rate = xp.where((members_per_domain > 1) & xp.pick(c.net.port_per_gpu, net), xp.maximum(rate, spread), rate)
    wire = message_bytes * factor * (group + offset) / group / rate
    return xp.where(group > 1, xp.pick(c.net.latency_s, net) + wire, 0.0)


def tp_overlap_terms(c: Context, m, xp, message_bytes, gather_bytes=None):
    """Time of one parallel region's TP collectives for each comm type, the fraction of
    them overlap can hide behind the neighbouring GEMM, and the time of one all-gather of
    the message (what redoing a sequence-parallel gather in backward costs).

    `gather_bytes` is the message of a sequence-parallel all-gather when it differs from the
    reduce-scatter's (default the same): under a precision recipe the gathered GEMM input
    travels quantized and the reduce-scatter of GEMM outputs in BF16 (Transformer Engine's
    gather_along_first_dim with the input's quantizer; reduce_scatter_along_first_dim of the
    BF16 output, module/linear.py). All-reduces (ar, p2p_rs_ag) reduce outputs: BF16.

    ar:        one all-reduce per parallel region.
    p2p_rs_ag: the all-reduce done as a reduce-scatter then an all-gather.
    rs_ag:     sequence parallelism: an all-gather before and a reduce-scatter after each
               region (same bytes as one all-reduce, split in two).
    Overlap 'ring' decomposes a collective into tp-1 ring steps hidden behind 1/tp slices of
    the GEMM (all but the first slice hide), paying one latency per step; an opaque
    all-reduce (ar) cannot be decomposed so ring hides nothing there. Overlap 'pipe' chunks
    the GEMM PIPE_CHUNKS ways and hides all but the first chunk, paying one latency per chunk.
    """
    t, net = m.tp, m.tp_net
    latency = xp.pick(c.net.latency_s, net)
    all_reduce = collective_s(c, xp, Collective.all_reduce, t, message_bytes, net)
    all_gather = collective_s(c, xp, Collective.all_gather, t, message_bytes, net)
    split_pair = collective_s(c, xp, Collective.reduce_scatter, t, message_bytes, net) + all_gather
    if gather_bytes is not None:     # sequence parallelism gathers the quantized input
        input_gather = collective_s(c, xp, Collective.all_gather, t, gather_bytes, net)
        split_pair = split_pair + xp.where(m.seq_par, input_gather - all_gather, 0.0)
        all_gather = xp.where(m.seq_par, input_gather, all_gather)
    region_s = xp.where(m.tp_comm_ar, all_reduce, split_pair)
    collectives_per_region = xp.where(m.tp_comm_ar, 1.0, 2.0)
    extra_latency = xp.where(m.tp_overlap_ring, xp.where(m.tp_comm_ar, 0.0, (t - 2) * latency),
                             xp.where(m.tp_overlap_pipe, (PIPE_CHUNKS - 1) * latency, 0.0))
    region_s = region_s + xp.where(t > 1, collectives_per_region * extra_latency, 0.0)
    hidden_fraction = xp.where(m.tp_overlap_ring, xp.where(m.tp_comm_ar, 0.0, (t - 1) / t),
                               xp.where(m.tp_overlap_pipe, (PIPE_CHUNKS - 1) / PIPE_CHUNKS, 0.0))
    return region_s, hidden_fraction, all_gather


def overlapped(exposed_candidate_s, window_s, hidden_fraction, usage, xp):
    """Split communication time into the part left exposed and the compute it steals.

    At most `hidden_fraction` of the communication, and no more than the compute window
    beside it, runs concurrently with compute; while it does, it takes `usage` of the GPU
    cores, which delays the compute by usage × the hidden time."""
    hidden = hidden_fraction * xp.minimum(exposed_candidate_s, window_s)
    return exposed_candidate_s - hidden, usage * hidden
