"""Tables of the exact model that the surrogate is built from, and the per-block lower
bounds computed from them with numpy.

Every table is the exact model (costmodel.iteration's own functions) evaluated on a grid
of the few dimensions it depends on, minimised over the flags it is not keyed by; so
each is a lower bound of the corresponding exact term for every mapping.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from ortools.sat.python import cp_model

from costmodel.comm import collective_s
from costmodel.context import Context
from costmodel.choices import PipelineSchedule, Recompute, ShardingStage, TPComm
from costmodel.dimensions import (DIMENSIONS, GROUP_DEGREES, NETWORK_GROUPS, SPLIT_DEGREES, SUBGROUP_CODES, BlockKey,
                                  group_spans, subgroup_limit)
from costmodel.encoding import MappingArrays, code
from costmodel.moe import moe_communication
from costmodel.iteration import RESIDENT_BLOCKS, block_terms, bubble_microbatches, iteration_terms, output_layer_s
from costmodel.pipeline import stage_blocks, stage_blocks_in_flight
from costmodel.evaluate import array_fields
from costmodel.ops import ArrayOps, ScalarOps
from costmodel.system import Collective
from solver.search.cpsat.variables import Variables
from solver.space.declaration import Space, flag_projection

TABLE_CHUNK_ROWS = 1 << 18
"""Rows of the block grid evaluated at once (a whole number of keys): bounds the memory the
block's intermediate terms take while the tables are built."""

FIT_SLACK = 1 + 1e-9
"""Block floors test exact footprints against capacities with this relative slack, so that
floating-point rounding can never rule out a mapping the exact model finds feasible."""

TIME_FLOOR_SLACK = 1 - 1e-9
"""Block floors are scaled down by this relative slack: they sum the exact model's terms in
another order than the evaluator does, so without it a floor could exceed the exact time it
bounds by an ulp and certify, or cut, a block that holds the optimum."""

ACT_CLASSES = ("no_sp", "sp", "sp_redo")
"""How stored activations split: no sequence parallelism; SP storing the gathered GEMM
inputs; SP redoing the all-gather in backward."""


RECOMPUTE_FULL, RECOMPUTE_ATTN_ONLY, RECOMPUTE_NONE = (code("recompute", r) for r in
                                                      (Recompute.full, Recompute.attn_only, Recompute.none))
RECOMPUTES = (RECOMPUTE_FULL, RECOMPUTE_ATTN_ONLY, RECOMPUTE_NONE)
TP_COMM_RS_AG = code("tp_comm", TPComm.rs_ag)
SCHED_ZB_H1 = code("sched", PipelineSchedule.zb_h1)
BLOCK_FLAGS = ("tp_comm", "seq_par_ag_redo", "recompute", "weight_offload", "activations_offload")
"""The flags one block's time reads, in the order the block tables are keyed by."""

# Columns the tables' grids do not set: numbers 1, flags their first code, no recompute.
# The tables built from them never read these.
_DEFAULT_COLUMNS = {**{dim.name: 0 if dim.is_flag else 1 for dim in DIMENSIONS}, "recompute": RECOMPUTE_NONE}


def _namespace(**columns) -> SimpleNamespace:
    """The evaluator's mapping fields for a grid of partial mappings (MappingArrays columns;
    those not given take the defaults above, which the tables built from them never read)."""
    n = len(next(iter(columns.values())))
    arrays = MappingArrays.of(**{k: np.broadcast_to(np.asarray(v), (n,))
                                 for k, v in {**_DEFAULT_COLUMNS, **columns}.items()})
    return array_fields(arrays)


class Named:
    """An array whose axes are named, each with the values it runs over: tables are read by
    name and value (`.sel(recompute=RECOMPUTE_NONE)`, `.min("tp_net")`), never by position."""

    def __init__(self, values: np.ndarray, axes: dict[str, tuple]):
        self.values, self.axes = values, axes

    @staticmethod
    def grid(**axes) -> tuple[dict[str, np.ndarray], "Named"]:
        """The Cartesian product of named axes as flat columns to evaluate on, and an empty
        Named to shape the results with (`.of`)."""
        names = list(axes)
        mesh = np.meshgrid(*[np.asarray(axes[k]) for k in names], indexing="ij")
        return ({k: g.ravel() for k, g in zip(names, mesh)},
                Named(np.empty(mesh[0].shape), {k: tuple(np.asarray(axes[k]).tolist()) for k in names}))

    def of(self, flat) -> "Named":
        """Flat results over the grid's rows (or one broadcast value) as a Named of its shape."""
        shape = self.values.shape
        return Named(np.broadcast_to(flat, (math.prod(shape),)).reshape(shape), self.axes)

    def _axis(self, name: str) -> int:
        return list(self.axes).index(name)

    def sel(self, **picks) -> "Named":
        """The values at the given axis values; a list keeps the axis with those values, a
        single value drops it."""
        values, axes = self.values, dict(self.axes)
        for name, pick in picks.items():
            axis = list(axes).index(name)
            if isinstance(pick, (list, tuple)):
                values = np.take(values, [axes[name].index(p) for p in pick], axis=axis)
                axes[name] = tuple(pick)
            else:
                values = np.take(values, axes[name].index(pick), axis=axis)
                del axes[name]
        return Named(values, axes)

    def min(self, *names: str, where: "Named | None" = None) -> "Named":
        """The minimum over the named axes (all but `key` when none are named). With `where`,
        over the entries it allows only; where it allows none (no mapping there is feasible,
        and the constraints exclude it), the plain minimum, a lower bound still."""
        names = names or tuple(n for n in self.axes if n != "key")
        axis = tuple(self._axis(n) for n in names)
        plain = self.values.min(axis=axis)
        if where is not None:
            masked = np.where(where.values, self.values, np.inf).min(axis=axis)
            plain = np.where(np.isfinite(masked), masked, plain)
        return Named(plain, {k: v for k, v in self.axes.items() if k not in names})


def best_expert_networks(c: Context, keys, networks: int) -> dict[str, np.ndarray]:
    """For each (tp, cp, ep, etp, microbatch) key, the network of the ep group and of the etp
    group whose own collectives take least time (costmodel.moe.moe_communication: the
    all-to-alls on ep's, the routed rows' gather and scatter on etp's), among the networks
    each group fits (all of them when it fits none: a lower bound still). Nothing else in a
    block reads these two networks, and a block's time (its forward, backward, recompute
    and the offload they leave exposed) never falls as either collective grows, so these
    choices give exactly the minimum over both network axes, without a grid axis each."""
    size = np.asarray(c.net_size)
    tokens = keys.microbatch * c.seq / keys.cp
    spans = {name: span for name, _, span, _ in group_spans(keys)}
    out = {}
    for name, net in (("ep", "ep_net"), ("etp", "etp_net")):
        if not c.moe_blocks:
            out[net] = np.zeros(len(tokens), dtype=np.intp)
            continue
        times = []
        for k in range(networks):
            comm = moe_communication(c, ArrayOps, tokens, keys.tp, keys.ep, keys.etp, np.full(len(tokens), k),
                                     np.full(len(tokens), k))
            times.append(comm.dispatch_s + comm.combine_s if name == "ep" else comm.tp_gather_s + comm.tp_scatter_s)
        times = np.stack(np.broadcast_arrays(*times))                                   # [networks, keys]
        fit = (getattr(keys, name) == 1)[None, :] | (spans[name][None, :] <= size[:, None])
        masked = np.where(fit, times, np.inf)
        out[net] = np.where(np.isfinite(masked).any(axis=0), masked.argmin(axis=0), times.argmin(axis=0)).astype(np.intp)
    return out


class Tables:
    """Exact-model tables over (tp, cp, ep, etp, microbatch) and the (tp, cp, ep, etp, pp) split,
    minimised over the flags they do not read."""

    def __init__(self, c: Context, v: Variables, num_gpus: int, tp_overlaps: tuple[int, ...], networks: int):
        self.tm_keys = list(v.group_mb)
        self.tp_keys = list(v.split)
        nets = list(range(networks))
        tm = np.array(self.tm_keys, dtype=float)
        # ---- block tables over (tp, cp, ep, etp, microbatch) × comm × overlap × redo ×
        # recompute × offloads × the TP and CP networks; the EP and ETP networks per key ----
        group_at = {name: i for i, name in enumerate(GROUP_DEGREES)}
        keys = _namespace(**{name: tm[:, i] for name, i in group_at.items()}, microbatch=tm[:, len(group_at)])
        expert_nets = best_expert_networks(c, keys, networks)
        block_nets = {net: (nets if name == "tp" or any(k[group_at[name]] > 1 for k in self.tm_keys) else [0])
                      for name, net in NETWORK_GROUPS if name in ("tp", "cp")}
        cols, grid = Named.grid(key=np.arange(len(tm)), tp_comm=[0, 1, 2], tp_overlap=[0, 1, 2],
                                seq_par_ag_redo=[False, True], recompute=[RECOMPUTE_FULL, RECOMPUTE_ATTN_ONLY, RECOMPUTE_NONE],
                                weight_offload=[False, True], activations_offload=[False, True], **block_nets)
        # (evaluated a few keys at a time: the block's intermediate terms over the whole grid
        # would take gigabytes; only the sums the tables keep stay whole)
        size = np.asarray(c.net_size)
        rows_per_key = len(cols["key"]) // len(tm)
        keys_per_chunk = max(1, TABLE_CHUNK_ROWS // rows_per_key)
        parts: dict[str, list] = {}
        for first_key in range(0, len(tm), keys_per_chunk):
            rows = slice(first_key * rows_per_key, min(len(tm), first_key + keys_per_chunk) * rows_per_key)
            for name, values in self._block_rows(c, tm, cols, rows, group_at, expert_nets, size, nets).items():
                parts.setdefault(name, []).append(values)
        whole = {name: np.concatenate(chunks) for name, chunks in parts.items()}
        fits = grid.of(whole["fits"])
        networks_axes = tuple(block_nets)

        def by_block_flags(values) -> dict:
            """One table per combination of the flags a block reads (BLOCK_FLAGS), minimised
            over the networks that fit and (TP overlap only changes time: the best the space
            offers bounds every one) the TP overlaps offered."""
            table = grid.of(values).min(*networks_axes, where=fits).sel(tp_overlap=list(tp_overlaps)).min("tp_overlap")
            return {(comm, redo, rc, w, a): self._by_tm(table.sel(tp_comm=comm, seq_par_ag_redo=bool(redo), recompute=rc,
                                                                  weight_offload=bool(w),
                                                                  activations_offload=bool(a)).values)
                    for comm in range(3) for redo in (0, 1) for rc in RECOMPUTES for w in (0, 1) for a in (0, 1)}

        # one block, one microbatch, forward + backward + recompute + exposed TP and offload:
        # exact for every flag combination the block reads
        self.block = by_block_flags(whole["block"])
        # the same block in a ZB-H1 bubble: less twice its weight-gradient GEMMs (costmodel.iteration)
        self.block_zb = by_block_flags(whole["block_zb"])
        self.compute = self._by_tm(grid.of(whole["compute"]).min().values)
        self.head = self._by_tm(3 * grid.of(whole["head"]).min().values)
        # With overlapped sends (costmodel.pipeline_time) the exposed part can be 0: a lower bound.
        self.p2p = self._by_tm(grid.of(whole["p2p"] * (0.0 if c.pp_comm_overlap else 1.0)).min().values)
        # activation classes: the (TP communication, AG redo) that realise each class, with
        # no offload, TP overlap and networks at their first values (memory reads none of them)
        cls_rows = {"no_sp": (0, False), "sp": (TP_COMM_RS_AG, False), "sp_redo": (TP_COMM_RS_AG, True)}
        first = dict(tp_overlap=0, weight_offload=False, activations_offload=False, **{net: 0 for net in block_nets})
        stored, workspace = grid.of(whole["stored"]), grid.of(whole["workspace"])
        self.stored = {(rc, cls): self._by_tm(stored.sel(tp_comm=comm, seq_par_ag_redo=redo, recompute=rc, **first).values)
                       for rc in RECOMPUTES for cls, (comm, redo) in cls_rows.items()}
        self.workspace = {(rc, cls): self._by_tm(workspace.sel(tp_comm=comm, seq_par_ag_redo=redo, recompute=rc,
                                                               **first).values)
                          for rc in RECOMPUTES for cls, (comm, redo) in cls_rows.items()}

        # ---- stage tables over (tp, cp, ep, etp, pp) × sharding stage × offload flags × net ----
        # (with one microbatch per replica: ZeRO-2/3 traffic grows with the microbatches, so
        # the DP table, minimised over every stage, stays a lower bound for any count)
        tpp = np.array(self.tp_keys, dtype=float)
        stages = list(range(len(ShardingStage)))
        cols, grid = Named.grid(key=np.arange(len(tpp)), zero=stages, weight_offload=[False, True],
                                optimizer_offload=[False, True], dp_net=nets)
        split = {name: tpp[cols["key"], i] for i, name in enumerate(SPLIT_DEGREES)}
        t_, c_, p_ = split["tp"], split["cp"], split["pp"]
        dp = num_gpus // (t_ * c_ * p_).astype(np.int64)
        # (the gradient group's network is dp's when dp > 1, else cp's, else tp's — with dp =
        # cp = 1 only an MoE's expert group reduces —: the same grid axis)
        ns = _namespace(**split, dp=dp, batch=dp, microbatch=np.ones(len(t_)),
                        cp_net=cols["dp_net"], tp_net=cols["dp_net"], **{k: v_ for k, v_ in cols.items() if k != "key"})
        terms = iteration_terms(c, ns, ArrayOps)

        # Exposed + stolen DP time is at least usage × the reduction time (overlap hides at
        # most all of it, stealing `usage` of the compute meanwhile), and all of it unoverlapped;
        # over the networks the gradient group's carrier fits: dp's spans every GPU, cp's
        # (carrying it when dp = 1) tp·cp.
        usage = np.minimum(1.0, np.asarray(c.net_usage)[ns.dp_net])
        grad_fits = grid.of(((dp == 1) | (num_gpus <= size[ns.dp_net])) & ((c_ == 1) | (t_ * c_ <= size[ns.dp_net]))
                            & ((dp > 1) | (c_ > 1) | (t_ == 1) | (t_ <= size[ns.dp_net])))
        # (hybrid sharding, `shard`, may reduce faster: the least over every sub-group a split takes)
        dp_comm = terms.dp_comm_s
        dp_cp = (dp * c_).astype(np.int64)
        limit = np.array([subgroup_limit(g) for g in dp_cp])
        for code in (code for code in SUBGROUP_CODES if 0 < code <= limit.max(initial=1)):
            sub = _namespace(**split, dp=dp, batch=dp, microbatch=np.ones(len(t_)), cp_net=cols["dp_net"],
                             tp_net=cols["dp_net"], shard=np.where(code <= limit, code, 0),
                             **{k: v_ for k, v_ in cols.items() if k != "key"})
            dp_comm = np.minimum(dp_comm, iteration_terms(c, sub, ArrayOps).dp_comm_s)
        self.dp_comm = self._by_tp(grid.of(dp_comm * usage).min(where=grad_fits).values)
        # keyed by the sharding stage (code z) and the offload switches they read
        optimizer = grid.of(terms.optimizer_s)
        self.optimizer = {z: self._by_tp(optimizer.sel(zero=z).min().values) for z in stages}
        none = dict(dp_net=0)

        def by_stage(values, **offloads) -> dict:
            return {z: self._by_tp(grid.of(values).sel(zero=z, **offloads, **none).values) for z in stages}

        self.weights_hbm = {(z, w): table for w in (0, 1) for z, table in
                            by_stage(terms.weights_hbm_bytes, weight_offload=bool(w), optimizer_offload=False).items()}
        self.optimizer_hbm = {(z, o): table for o in (0, 1) for z, table in
                              by_stage(terms.optimizer_hbm_bytes, weight_offload=False, optimizer_offload=bool(o)).items()}
        off = dict(weight_offload=False, optimizer_offload=False)
        self.weights_and_grads = by_stage(terms.weights_bytes + terms.weight_grads_bytes, **off)
        self.optimizer_state = by_stage(terms.optimizer_bytes, **off)
        self.embedding = by_stage(terms.embedding_bytes, **off)

    @staticmethod
    def _block_rows(c: Context, tm: np.ndarray, cols: dict, rows: slice, group_at: dict, expert_nets: dict,
                    size: np.ndarray, nets: list) -> dict[str, np.ndarray]:
        """The block grid's rows `rows`: what the block tables keep of one block's terms (its
        time, in a ZB-H1 bubble too, compute, output layer, sends, stored activations and
        workspace) and whether its TP and CP groups fit their networks (evaluate.network_checks;
        a group of one fits any: a mapping putting a group on a network too small for it is
        infeasible, so the minimum over the networks only needs to run over those that fit)."""
        key = cols["key"][rows]
        ns = _namespace(**{name: tm[key, i] for name, i in group_at.items()}, microbatch=tm[key, len(group_at)],
                        **{k: v_[rows] for k, v_ in cols.items() if k != "key"},
                        **{net: best[key] for net, best in expert_nets.items()})
        n = len(key)
        blk = block_terms(c, ns, ArrayOps)
        total = blk.block_fwd_s + blk.block_bwd_s + blk.recompute_s + blk.offload_fwd_s + blk.offload_bwd_s
        fits = np.ones(n, dtype=bool)
        for name, degree, span, net in group_spans(ns):
            if name in ("tp", "cp"):
                fits &= (degree == 1) | (span <= size[net])
        p2p = np.stack([collective_s(c, ArrayOps, Collective.p2p, 2.0, blk.act_message_bytes / ns.tp,
                                     np.full(n, k)) for k in nets]).min(axis=0)
        out = {"block": total, "block_zb": total - 2 * blk.weight_grad_gemm_s,
               "compute": blk.compute_fwd_s + blk.compute_bwd_s, "head": output_layer_s(c, ns, ArrayOps),
               "p2p": p2p, "stored": blk.activations.stored, "workspace": blk.activations.workspace, "fits": fits}
        return {name: np.broadcast_to(values, (n,)) for name, values in out.items()}

    def _by_tm(self, values: np.ndarray) -> dict:
        return {k: float(x) for k, x in zip(self.tm_keys, values)}

    def _by_tp(self, values: np.ndarray) -> dict:
        return {k: float(x) for k, x in zip(self.tp_keys, values)}


def offers_zero_bubble(space: Space, num_networks: int) -> bool:
    """Whether some mapping of the space (with pp > 1) may run ZB-H1."""
    known = {**{name: 2 for name, _ in NETWORK_GROUPS}, "dp_cp": 2, "offload": 1}
    return (SCHED_ZB_H1,) in flag_projection(space, ("sched",), known, num_networks)


def block_lower_bounds(tables: Tables, c: Context, space: Space, skeletons, local_batch: dict, has_offload: bool,
                       num_networks: int, hbm_capacity_bytes: float) -> dict:
    """For each (tp, cp, ep, etp, pp, interleaving, microbatch) block, the smallest value the surrogate
    time takes over the memory-relevant flags whose HBM and offload footprints fit (inf when
    none does). Computed with numpy from the surrogate's own tables, with the pipeline
    bubble and the blocks in flight exactly as the model counts them for this interleaving
    and microbatch (which the CP-SAT objective only bounds), so it is a lower bound of every
    exact time in the block and every footprint it checks is the exact one. It ranks
    candidates for exact scoring, and its minimum per (tp, pp) split and per (tp,
    microbatch) becomes a cut that gives CP-SAT's LP the bound its one-hot relaxation
    cannot."""
    blocks = c.blocks
    # every valid assignment of the flags a block reads (the space's own rules, tp, pp, dp > 1)
    known = {**{name: 2 for name, _ in NETWORK_GROUPS}, "dp_cp": 2, "offload": int(has_offload)}
    combos = sorted(flag_projection(space, BLOCK_FLAGS, known, num_networks))
    zero_codes = tuple(code for (code,) in flag_projection(space, ("zero",), known, num_networks))
    zero_bubble = offers_zero_bubble(space, num_networks)
    out = {}
    for sk in skeletons:
        g, p = sk.group, sk.pp
        key = sk.split
        mbs = np.array(sk.microbatches, dtype=float)
        ils = np.array(sk.interleavings, dtype=float)
        n = local_batch[key] / mbs                                           # [M]
        il = ils[:, None]                                                    # [V, 1]
        bubble = bubble_microbatches(ArrayOps, p, il, n[None, :])           # [V, M]
        block = np.array([[tables.block[cb][(*g, int(mb))] for cb in combos] for mb in mbs])  # [M, K]
        head = np.array([tables.head[(*g, int(mb))] for mb in mbs])           # [M]
        sends = np.array([tables.p2p[(*g, int(mb))] for mb in mbs]) if p > 1 else np.zeros(len(mbs))
        # time[V, M, K] without the optimizer and DP terms (added per sharding below); with
        # uneven stages (costmodel.pipeline) the slowest of the middle and the last stage
        first, middle, last = stage_blocks(ScalarOps, blocks, p)
        per_micro = np.maximum(middle * block, last * block + head[:, None])  # [M, K]
        time = (n[None, :] + bubble)[:, :, None] * (per_micro[None] + (2 * il * sends[None, :])[:, :, None])
        if zero_bubble and p > 1 and 1 in sk.interleavings:
            # ZB-H1 on the non-interleaved row: n microbatches + (p-1) bubble ones without W
            block_zb = np.array([[tables.block_zb[cb][(*g, int(mb))] for cb in combos] for mb in mbs])
            row = sk.interleavings.index(1)
            sends_1 = (2 * sends)[:, None]
            # (uneven, a middle stage may set the pace, with no output layer in its bubble)
            zb_head = head[:, None] if middle == last else 0.0
            zb = n[:, None] * (per_micro + sends_1) + (p - 1) * (last * block_zb + zb_head + sends_1)
            time[row] = np.minimum(time[row], zb)
        cls = ["sp_redo" if (comm == TP_COMM_RS_AG and redo) else ("sp" if comm == TP_COMM_RS_AG else "no_sp")
               for comm, redo, rc, w, a in combos]
        stored = np.array([[tables.stored[(cb[2], cl)][(*g, int(mb))] for cb, cl in zip(combos, cls)] for mb in mbs])
        workspace = np.array([[tables.workspace[(cb[2], cl)][(*g, int(mb))] for cb, cl in zip(combos, cls)]
                              for mb in mbs])
        a_off = np.array([cb[4] for cb in combos], dtype=bool)
        w_off = np.array([cb[3] for cb in combos])
        # a first-stage GPU's (the tables' memory terms are the first stage's too)
        inflight = stage_blocks_in_flight(ArrayOps, first, middle, last, p, il, n[None, :])[0][:, :, None]  # [V, M, 1]
        all_activations = stored[None] * inflight                                                  # [V, M, K]
        activations_hbm = np.where(a_off, np.minimum(RESIDENT_BLOCKS, inflight) * stored[None], all_activations)
        activations_offloaded = np.where(a_off, all_activations, 0.0)
        best = np.full((len(ils), len(mbs)), math.inf)
        stages = zero_codes if sk.dp * sk.cp > 1 else (0,)
        for z in stages:
            for o in ((0, 1) if has_offload else (0,)):
                memory = (np.array([tables.weights_hbm[(z, w)][key] for w in w_off]) + activations_hbm + workspace[None]
                          + tables.optimizer_hbm[(z, o)][key] + tables.embedding[z][key])       # [V, M, K]
                offloaded = (w_off * tables.weights_and_grads[z][key] + o * tables.optimizer_state[z][key]
                             + activations_offloaded)                                                   # [V, M, K]
                # (a hair of slack: these sums round differently from the evaluator's)
                fits = (memory <= hbm_capacity_bytes * FIT_SLACK) & (offloaded <= c.offload_capacity_bytes * FIT_SLACK)
                if not fits.any():
                    continue
                extra = tables.optimizer[z][key] + tables.dp_comm[key]
                best = np.minimum(best, np.where(fits, time, np.inf).min(axis=2) + extra)
        for i, il in enumerate(sk.interleavings):
            for j, mb in enumerate(sk.microbatches):
                out[BlockKey(*key, il, mb)] = float(best[i, j]) * TIME_FLOOR_SLACK
    return out


def stage_floors(blocks: int, pp_values, v: Variables) -> tuple[dict, dict]:
    """Per pp value: (blocks a stage's time is at least that of, blocks per microbatch in
    flight a first-stage GPU keeps at least). Even: L/pp both. Uneven (m = (L+2)/pp): the
    last stage's m - 1 blocks in time; in memory m - 1 with 1F1B, m - 2 when the space lets
    that pp interleave (the first chunk of each microbatch one block short: at most
    2·min(n, pp) chunks short, costmodel.pipeline.short_first_chunks_in_flight)."""
    time_blocks, memory_blocks = {}, {}
    for p in pp_values:
        first, _, last = stage_blocks(ScalarOps, blocks, p)
        time_blocks[p] = float(last)
        if first == blocks / p:
            memory_blocks[p] = float(first)
        else:
            share = first + 1                 # m: interleaving divides it
            interleaves = any(il > 1 and share % il == 0 for il in v.interleaving.is_)
            memory_blocks[p] = float(first - 1 if interleaves else first)
    return time_blocks, memory_blocks


def even_layout_literals(m: cp_model.CpModel, v: Variables, blocks: int) -> list:
    """Literals meaning "the layout is even" ([] when every pp is even, [None] when none is)."""
    even = [lit for p, lit in v.pp.is_.items() if blocks % p == 0]
    if len(even) == len(v.pp.is_):
        return []
    if not even:
        return [None]
    lit = m.NewBoolVar("even_stages")
    m.AddBoolOr(even).OnlyEnforceIf(lit)
    for e in even:
        m.AddImplication(e, lit)
    return [lit]
