"""Tables of the exact model that the surrogate is built from (the per-block lower bounds
computed from them with numpy: solver.search.cpsat.block_floors).

Every table is the exact model (costmodel.terms.iteration's own functions) evaluated on a grid
of the few dimensions it depends on, minimised over the flags it is not keyed by; so
each is a lower bound of the corresponding exact term for every mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from costmodel.terms.context import Context
from costmodel.space.choices import ShardingStage
from costmodel.space.dimensions import SPLIT_DEGREES, data_parallel, subgroup_limit
from costmodel.space.layout import EMBEDDING_AND_LOSS_BLOCKS, layout_interleavings, stage_blocks
from costmodel.ops import ScalarOps
from solver.space.declaration import Space

from solver.search.cpsat.kind_floors import distinct_layouts, kind_tables
from solver.search.cpsat.block_floors import block_lower_bounds, offers_zero_bubble
from solver.search.cpsat.block_tables import (ACT_CLASSES, BLOCK_TABLES, RECOMPUTE_ATTN_ONLY, RECOMPUTE_FULL,
                                              RECOMPUTE_NONE, TP_COMM_RS_AG, BlockTableCache, Named, SplitKeys,
                                              _block_tables, _grid_terms, local_batches_of)

if TYPE_CHECKING:          # OR-Tools is imported only where a CP-SAT model is built
    from ortools.sat.python import cp_model

    from solver.search.cpsat.variables import Variables

# read from here by the surrogate, the engine and the tests (the block tables' names too)
__all__ = ["ACT_CLASSES", "RECOMPUTE_ATTN_ONLY", "RECOMPUTE_FULL", "RECOMPUTE_NONE", "TP_COMM_RS_AG", "BlockTableCache",
           "SplitKeys", "Tables", "block_lower_bounds", "even_layout_literals", "local_batches_of",
           "offers_zero_bubble", "stage_floors"]


@dataclass(frozen=True)
class StageTables:
    """The stage tables of one shard-group size (Tables.by_shard), each keyed by the sharding stage
    z (and the offload switch it reads), an array over the (tp, cp, ep, etp, pp) splits
    (Tables.split_index): the DP
    reduction's once-a-step part and its part per microbatch (× the network's usage), the
    optimizer step, and the first stage's per-GPU state."""

    code: int
    """the shard-group code (0: the whole dp·cp group)"""
    splits: set
    """the splits that take this group (its size divides their dp·cp)"""
    dp_once: dict
    dp_per_microbatch: dict
    optimizer: dict
    weights_hbm: dict
    optimizer_hbm: dict
    weights_and_grads: dict
    optimizer_state: dict
    embedding: dict


class Tables:
    """Exact-model tables over (tp, cp, ep, etp, microbatch) and the (tp, cp, ep, etp, pp)
    split, minimised over the flags they do not read. `v`: anything listing the keys
    (`group_mb`, `split`): the CP-SAT Variables or SplitKeys. `cache`: the (tp, cp, ep, etp,
    microbatch) tables shared with other GPU counts of the same context (BlockTableCache).
    `space`: the codes the flags the tables minimise over may take (Space.codes: every TP
    overlap offered, the CP communications and shard groups the pins admit). `block_memo`:
    exact block terms already computed in this context (costmodel.evaluate.distinct_block_terms;
    CountShare keeps one)."""

    def __init__(self, c: Context, v: Variables | SplitKeys, num_gpus: int, space: Space, networks: int,
                 cache: BlockTableCache | None = None, block_memo: dict | None = None,
                 check: Callable[[], None] | None = None):
        tp_overlaps = space.codes("tp_overlap", pinned=False)
        cp_comms, shards = space.codes("cp_comm"), space.codes("shard")
        self.several_kinds = len(c.model.block_kinds) > 1       # (each stage sums its own: kind_floors)
        self.tm_keys = list(v.group_mb)
        self.tp_keys = list(v.split)
        nets = list(range(networks))
        size = np.asarray(c.net.size)
        if cache is not None:
            block, self.row_memo = cache.lookup(c, self.tm_keys, tp_overlaps, networks, cp_comms, check)
        else:
            block = _block_tables(c, self.tm_keys, tp_overlaps, networks, cp_comms, check)
            self.row_memo = {}
        self.block, self.block_zb, self.compute, self.head, self.p2p, self.stored, self.workspace = (
            block[name] for name in BLOCK_TABLES)
        self.kind_blocks, self.kind_stored, self.kind_workspace = kind_tables(block, self.several_kinds and c)

        # ---- stage tables over (tp, cp, ep, etp, pp) × sharding stage × offload flags × net ----
        # (with one microbatch per replica: ZeRO-2/3 traffic grows with the microbatches, so
        # the DP table, minimised over every stage, stays a lower bound for any count; the
        # block floors take each stage's at the block's microbatches, dp_per_microbatch)
        tpp = np.array(self.tp_keys, dtype=float)
        stages = list(range(len(ShardingStage)))
        switches = _stage_offload_codes(c)
        cols, grid = Named.grid(key=np.arange(len(tpp)), zero=stages, weight_offload=switches,
                                optimizer_offload=switches, dp_net=nets)
        split = {name: tpp[cols["key"], i] for i, name in enumerate(SPLIT_DEGREES)}
        t_, c_ = split["tp"], split["cp"]
        dp = data_parallel(num_gpus, split)
        # (the gradient group's network is dp's when dp > 1, else cp's, else tp's — with dp =
        # cp = 1 only an MoE's expert group reduces —: the same grid axis)
        base = dict(**split, dp=dp, microbatch=np.ones(len(t_)), cp_net=cols["dp_net"], tp_net=cols["dp_net"],
                    **{k: v_ for k, v_ in cols.items() if k != "key"})
        dp_net = cols["dp_net"]
        check = check or (lambda: None)       # (a deadline's: raises when it has passed)
        check()
        terms = _stage_terms(c, block_memo, {**base, "batch": dp})

        # Exposed + stolen DP time is at least usage × the reduction time (overlap hides at
        # most all of it, stealing `usage` of the compute meanwhile), and all of it unoverlapped;
        # over the networks the gradient group's carrier fits: dp's spans every GPU, cp's
        # (carrying it when dp = 1) tp·cp.
        usage = np.minimum(1.0, np.asarray(c.net.usage)[dp_net])
        grad_fits = grid.of(((dp == 1) | (num_gpus <= size[dp_net])) & ((c_ == 1) | (t_ * c_ <= size[dp_net]))
                            & ((dp > 1) | (c_ > 1) | (t_ == 1) | (t_ <= size[dp_net])))
        # Hybrid sharding (`shard`) may reduce faster: the least over every sub-group a split
        # takes that the space offers. Per sharding stage, that bound's once-a-step part and its
        # part per microbatch (ZeRO-2 reduce-scatters and ZeRO-3 also gathers every microbatch:
        # the traffic is linear in the microbatches; costmodel.terms.data_parallel's
        # per_microbatch_s); the block floors take them at each block's microbatch count.
        dp_cp = (dp * c_).astype(np.int64)
        limit = np.array([subgroup_limit(g) for g in dp_cp])
        codes = [0] + [code for code in shards if 0 < code <= limit.max(initial=1)]
        none = dict(dp_net=0)
        off = dict(weight_offload=False, optimizer_offload=False)

        def per_stage(table) -> dict:
            """A (key, zero) table's columns by sharding stage."""
            return {z: table.values[:, i] for i, z in enumerate(table.axes["zero"])}

        def by_stage(values, **offloads) -> dict:       # (a switch the grid keeps off only: its off values)
            return per_stage(grid.of(values).sel(**{name: on and on in switches for name, on in offloads.items()},
                                                 **none))

        rest = ("weight_offload", "optimizer_offload", "dp_net")

        # One StageTables per shard group the space offers (the whole dp·cp group first): the
        # block floors pair each group's DP time with its own memory. Their tables are arrays
        # over the splits, in tp_keys order (split_index).
        self.split_index = {k: i for i, k in enumerate(self.tp_keys)}
        self.by_shard: list[StageTables] = []
        dp_comm = np.inf
        n = len(dp)
        # (a shard group is evaluated on the rows of the splits that take it; the others read
        # inf, and the floors skip it for them. Every group's rows in one evaluation: the
        # terms are row by row, and one call costs far less than one per group.)
        taken = {0: np.arange(n), **{code: np.flatnonzero(code <= limit) for code in codes if code}}
        parts = {0: terms}
        if len(taken) > 1:
            check()
            at = np.concatenate(list(taken.values())[1:])
            grouped = _stage_terms(c, block_memo, {**{k: v_[at] for k, v_ in base.items()}, "batch": dp[at],
                                                   "shard": np.concatenate([np.full(len(rows), code)
                                                                            for code, rows in taken.items() if code])})
            start = 0
            for code, rows in list(taken.items())[1:]:
                parts[code] = _rows_of(grouped, len(at), slice(start, start + len(rows)))
                start += len(rows)
        for code in codes:
            check()
            rows, one_terms = taken[code], parts[code]

            def spread(values, rows=rows):
                out = np.full(n, np.inf)
                out[rows] = np.broadcast_to(values, (len(rows),))
                return out

            one = spread(one_terms.dp_comm_s)
            dp_comm = np.minimum(dp_comm, one)
            dp_once, dp_per_microbatch = (
                per_stage(grid.of(spread(values) * usage).min(*rest, where=grad_fits))
                for values in (one_terms.dp_once_s, one_terms.dp_per_microbatch_s))
            optimizer = grid.of(spread(one_terms.optimizer_s))
            takes = grid.of(code <= limit).sel(zero=0, **off, **none).values
            self.by_shard.append(StageTables(
                code=code, splits={k for k, ok in zip(self.tp_keys, takes) if ok},
                dp_once=dp_once, dp_per_microbatch=dp_per_microbatch,
                optimizer=per_stage(optimizer.min(*rest)),
                weights_hbm={(z, w): table for w in (0, 1) for z, table in by_stage(
                    spread(one_terms.weights_hbm_bytes), weight_offload=bool(w), optimizer_offload=False).items()},
                optimizer_hbm={(z, o): table for o in (0, 1) for z, table in by_stage(
                    spread(one_terms.optimizer_hbm_bytes), weight_offload=False, optimizer_offload=bool(o)).items()},
                weights_and_grads=by_stage(spread(one_terms.weights_bytes + one_terms.weight_grads_bytes), **off),
                optimizer_state=by_stage(spread(one_terms.optimizer_bytes), **off),
                embedding=by_stage(spread(one_terms.embedding_bytes), **off)))
        self.dp_comm = self._by_tp(grid.of(dp_comm * usage).min(where=grad_fits).values)
        # keyed by the sharding stage (code z) and the offload switches they read, then by the
        # split: the whole dp·cp group's, which holds the least state (the CP-SAT bounds)
        whole = self.by_shard[0]

        def by_split(tables: dict) -> dict:
            return {k: self._by_tp(values) for k, values in tables.items()}

        self.optimizer, self.weights_hbm, self.optimizer_hbm = (by_split(whole.optimizer), by_split(whole.weights_hbm),
                                                                by_split(whole.optimizer_hbm))
        self.weights_and_grads, self.optimizer_state, self.embedding = (
            by_split(whole.weights_and_grads), by_split(whole.optimizer_state), by_split(whole.embedding))

    def _by_tp(self, values: np.ndarray) -> dict:
        return {k: float(x) for k, x in zip(self.tp_keys, values)}


def _stage_offload_codes(c: Context) -> list[bool]:
    """The offload switches the stage grid evaluates: both with an offload tier; without one,
    off only. The space turns them on only where a tier exists (the weight and optimizer offload
    dimensions are free only when offload > 0), so without one the tables at "on" (the surrogate's
    terms gated by those switches) are never taken by a mapping; they hold the "off" values."""
    return [False, True] if c.memory.offload_capacity_bytes > 0 else [False]


STAGE_TERMS = ("dp_comm_s", "dp_per_microbatch_s", "optimizer_s", "weights_hbm_bytes", "optimizer_hbm_bytes",
               "weights_bytes", "weight_grads_bytes", "optimizer_bytes", "embedding_bytes")
"""The iteration terms the stage tables are built from (StageTables' sources)."""


def _stage_terms(c: Context, block_memo: dict | None, columns: dict) -> SimpleNamespace:
    """STAGE_TERMS and the DP reduction's once-a-step part (dp_once_s) of a grid of partial
    mappings, least row by row over one interleaving per distinct layout of each row's pp (with
    a short last chunk, costmodel.space.layout, the end stages' blocks move with the interleaving;
    elsewhere one layout, interleaving 1): a k-th layout on the rows whose pp has one."""
    pp_values, pp_of_row = np.unique(np.asarray(columns["pp"]).astype(np.int64), return_inverse=True)
    layouts = [distinct_layouts(c, p) for p in pp_values.tolist()]
    layouts_of_row, pp_of_row = np.array([len(ils) for ils in layouts])[pp_of_row.ravel()], pp_of_row.ravel()
    least = {name: np.full(len(pp_of_row), np.inf) for name in (*STAGE_TERMS, "dp_once_s")}
    for k in range(max(len(ils) for ils in layouts)):
        rows = np.flatnonzero(layouts_of_row > k)
        il = np.array([ils[min(k, len(ils) - 1)] for ils in layouts], dtype=np.int64)[pp_of_row[rows]]
        for start in range(0, len(rows), STAGE_CHUNK_ROWS):   # (row by row: chunks bound the terms' memory)
            part = slice(start, start + STAGE_CHUNK_ROWS)
            at = rows[part]
            terms = _grid_terms(c, block_memo, **{name: (v[at] if np.ndim(v) else v) for name, v in columns.items()},
                                interleaving=il[part])
            values = {name: np.broadcast_to(getattr(terms, name), (len(at),)) for name in STAGE_TERMS}
            values["dp_once_s"] = values["dp_comm_s"] - values["dp_per_microbatch_s"]
            for name, value in values.items():
                least[name][at] = np.minimum(least[name][at], value)
    return SimpleNamespace(**least)


STAGE_CHUNK_ROWS = 1 << 16
"""Rows of the stage grid evaluated at once: the iteration's terms of every row at once would
take gigabytes."""


def _rows_of(terms: SimpleNamespace, total: int, part: slice) -> SimpleNamespace:
    """The stage-table terms (`_stage_terms`) of rows `part` of a `total`-row evaluation."""
    return SimpleNamespace(**{name: np.broadcast_to(value, (total,))[part] for name, value in vars(terms).items()})


def stage_floors(blocks: int, pp_values, v: Variables) -> tuple[dict, dict]:
    """Per pp value: (blocks a stage's time is at least that of, blocks per microbatch in
    flight a first-stage GPU keeps at least). Even: L/pp both. With the embedding and the
    loss counted (m = (L+2)/pp): the last stage's m - 1 blocks in time; in memory m - 1 with
    1F1B, m - 2 when the space lets that pp interleave (the first chunk of each microbatch one
    block short: at most 2·min(n, pp) chunks short,
    costmodel.terms.pipeline.short_first_chunks_in_flight). With a short last chunk: the
    last stage's fewest blocks over the interleavings in time, and in memory the first
    stage's, v·⌈L/(pp·v)⌉ ≥ ⌈L/pp⌉, in full chunks (v·c·min(n, pp) in flight at least)."""
    time_blocks, memory_blocks = {}, {}
    for p in pp_values:
        first, middle, last = stage_blocks(ScalarOps, blocks, p)
        if first == blocks / p:
            time_blocks[p] = memory_blocks[p] = float(first)
        elif not (p > 2 and (blocks + EMBEDDING_AND_LOSS_BLOCKS) % p == 0):   # a short last chunk: shrinks with v
            time_blocks[p] = min(stage_blocks(ScalarOps, blocks, p, interleaving=il)[2]
                                 for il in layout_interleavings(int(blocks), p))
            memory_blocks[p] = float(first)
        else:
            time_blocks[p] = float(last)
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
    m.AddBoolOr(even).WithName("even_stages -> pp divides the blocks").OnlyEnforceIf(lit)
    for e in even:
        m.AddImplication(e, lit).WithName(f"{e.Name()} -> even_stages")
    return [lit]
