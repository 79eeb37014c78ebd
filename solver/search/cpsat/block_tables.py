"""The exact model's tables over (tp, cp, ep, etp, microbatch) that read neither the GPU count
nor the batch (solver.search.cpsat.tables.Tables takes them, and `mapsat plan` shares them
across counts through BlockTableCache), built on named-axis grids (solver.search.cpsat.named)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from costmodel.terms.comm import collective_s
from costmodel.terms.context import Context
from costmodel.errors import InputError
from costmodel.space.choices import CPComm, PipelineSchedule, Recompute, TPComm
from costmodel.space.dimensions import (DIMENSIONS, GROUP_DEGREES, NETWORK_CHECK, NETWORK_GROUPS, SPLIT_DEGREES,
                                  SURROGATE_AXIS, TIME_ONLY, data_parallel, touching)
from costmodel.encoding import MappingArrays, code
from costmodel.terms.moe import moe_communication
from costmodel.terms.iteration import iteration_terms, output_layer_s
from solver.search.cpsat.kind_floors import kind_block_rows, reduced_kind_rows
from solver.search.cpsat.named import Keyed, Named, extended_positions
from costmodel.evaluate import array_fields, cp_comm_heads_fit, distinct_block_terms, group_spans
from costmodel.ops import ArrayOps
from costmodel.inputs.system import Collective
from solver.space.declaration import Space


TABLE_CHUNK_ROWS = 1 << 20
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
ACT_CLASS_ROWS = {"no_sp": (0, False), "sp": (TP_COMM_RS_AG, False), "sp_redo": (TP_COMM_RS_AG, True)}
"""The (TP communication, AG redo) that realise each of ACT_CLASSES."""
SCHED_ZB_H1 = code("sched", PipelineSchedule.zb_h1)
BLOCK_TABLE_KEY = ("tp_comm", "seq_par_ag_redo", "recompute", "weight_offload", "activations_offload")
"""How the block tables' keys list the flags they keep one table per code of (`_group_tables`
by_block_flags, block_floors.GroupRows read by position)."""


def _keyed_flags() -> tuple[str, ...]:
    """The declaration's surrogate axes that are neither time only (the tables take the best
    code offered, which bounds every one) nor network-checked (the tables minimise over the
    codes that fit): the block tables keep one table per combination of their codes. Their
    order is BLOCK_TABLE_KEY's; a declaration that keys others fails here, not in a table."""
    keyed = set(touching(SURROGATE_AXIS, without=TIME_ONLY)) - set(touching(NETWORK_CHECK))
    if keyed != set(BLOCK_TABLE_KEY):
        raise ValueError(f"the block tables are keyed by {', '.join(BLOCK_TABLE_KEY)}; the declaration's keyed "
                         f"surrogate axes are {', '.join(sorted(keyed))}")
    return BLOCK_TABLE_KEY


BLOCK_FLAGS = _keyed_flags()
"""The flags one block's time reads that the block tables are keyed by, in their order."""
GRID_NETWORKS = {name: net for name, net in NETWORK_GROUPS if net in touching(SURROGATE_AXIS)}
"""Degree -> its network flag, for the groups whose network is an axis of the block grid (the
declaration's surrogate axes: tp's and cp's); the other networks a block reads (ep's,
etp's) are chosen per group (best_expert_networks)."""

# Columns the tables' grids do not set: numbers 1, flags their first code, no recompute.
# The tables built from them never read these.
_DEFAULT_COLUMNS = {**{dim.name: 0 if dim.is_flag else 1 for dim in DIMENSIONS}, "recompute": RECOMPUTE_NONE}


def _arrays(**columns) -> MappingArrays:
    """A grid of partial mappings as MappingArrays (the columns not given take the defaults
    above, which the tables built from them never read)."""
    n = len(next(iter(columns.values())))
    return MappingArrays.of(**{k: np.broadcast_to(np.asarray(v), (n,)) for k, v in {**_DEFAULT_COLUMNS, **columns}.items()})


def _namespace(**columns) -> SimpleNamespace:
    """The evaluator's mapping fields for a grid of partial mappings (see _arrays)."""
    return array_fields(_arrays(**columns))


def _grid_terms(c: Context, block_memo: dict | None, **columns):
    """iteration_terms over a grid of partial mappings, each distinct block's terms computed
    once (costmodel.evaluate.distinct_block_terms, with `block_memo`)."""
    arrays = _arrays(**columns)
    return iteration_terms(c, array_fields(arrays), ArrayOps, distinct_block_terms(c, arrays, block_memo))


class SplitKeys:
    """The (tp, cp, ep, etp, microbatch) groups and (tp, cp, ep, etp, pp) splits some skeleton
    has, in the order the CP-SAT variables list them (solver.search.cpsat.variables: sorted):
    what the tables are keyed by, known without building a CP-SAT model."""

    def __init__(self, skeletons):
        group_mb = set()
        for s in skeletons:
            group = s.group                     # (a property: read once per skeleton)
            group_mb.update((*group, mb) for mb in s.microbatches)
        self.group_mb = sorted(group_mb)
        self.split = sorted({s.split for s in skeletons})


def local_batches_of(splits, num_gpus: int, space: Space, max_batch: int) -> dict:
    """batch/dp of every (tp, cp, ep, etp, pp) split of `splits` (SPLIT_DEGREES; 1 where no
    batch exists)."""
    out = {}
    for split in splits:
        dp = data_parallel(num_gpus, dict(zip(SPLIT_DEGREES, split)))
        batch = space.batch_for(dp, max_batch)
        out[split] = max(1, (batch or 1) // dp)
    return out


ALL_CP_COMMS = tuple(code("cp_comm", member) for member in CPComm)
"""Every CP communication's code: what the block tables minimise over where cp > 1 unless the
space offers or its pins admit fewer (Space.codes)."""

BLOCK_TABLES = ("block", "block_zb", "compute", "head", "p2p", "stored", "workspace")
"""The tables over (tp, cp, ep, etp, microbatch): they read neither the GPU count nor the
batch (dp, pp and the batch stay at their defaults), so searches of one problem at several
GPU counts share them (BlockTableCache)."""


class BlockTableCache:
    """The (tp, cp, ep, etp, microbatch) tables of one exact-model context, each group
    computed once: Tables of that context at any GPU count take the cached tables (which may
    hold more groups than theirs) and compute only the groups missing. Keyed also by the TP
    overlaps, the CP communications and the networks the grid minimises over; each group's
    entry is what Tables would compute itself (_block_tables computes the groups with cp = 1
    and those with cp > 1 apart, so a group's entry never depends on the others); the EP and
    ETP networks are chosen per group (best_expert_networks), from that group alone."""

    def __init__(self):
        self._stores: dict[tuple, dict] = {}
        self._row_memos: dict[tuple, dict] = {}

    def lookup(self, c: Context, tm_keys: list, tp_overlaps: tuple, networks: int,
               cp_comms: tuple = ALL_CP_COMMS, check: Callable[[], None] | None = None) -> tuple[dict, dict]:
        """Each BLOCK_TABLES table, holding at least the groups `tm_keys`; and the memo of
        their rows as arrays (solver.search.cpsat.block_floors.GroupRows) kept with them. `check`:
        called between chunks of the grid (a deadline's: it raises, and nothing is stored)."""
        key = (tuple(tp_overlaps), networks, tuple(cp_comms))
        memo = self._row_memos.setdefault(key, {})
        store = self._stores.get(key)
        missing = tm_keys if store is None else [k for k in tm_keys if k not in store["compute"]]
        if missing:
            fresh = _block_tables(c, missing, tp_overlaps, networks, cp_comms, check)
            store = self._stores[key] = fresh if store is None else _merged(store, fresh)
        return store, memo


def _merged(store: dict, fresh: dict) -> dict:
    """The tables of `store` with `fresh`'s groups (none of them the store's) after its own:
    new Keyed tables over one new positions dict (Tables built before keep the old ones)."""
    positions = extended_positions(store["compute"].positions, fresh["compute"].positions)
    done: dict[int, Keyed] = {}            # (combinations sharing one table keep sharing it)

    def one(old: Keyed, more: Keyed) -> Keyed:
        if id(old) not in done:
            done[id(old)] = old.extended(more, positions)
        return done[id(old)]

    return {name: ({combo: one(sub, fresh[name][combo]) for combo, sub in table.items()}
                   if isinstance(table, dict) else one(table, fresh[name]))
            for name, table in store.items()}


def _block_net_axes(tm_keys, networks: int) -> dict[str, tuple]:
    """The TP and CP network axes of the block grid (GRID_NETWORKS): every network for tp,
    and for cp when some group has cp > 1, else the first only (a group of one fits any)."""
    nets = tuple(range(networks))
    at = GROUP_DEGREES.index("cp")
    return {net: (nets if name == "tp" or any(k[at] > 1 for k in tm_keys) else (0,))
            for name, net in GRID_NETWORKS.items()}


def best_expert_networks(c: Context, keys, networks: int) -> dict[str, np.ndarray]:
    """For each (tp, cp, ep, etp, microbatch) key, the network of the ep group and of the etp
    group whose own collectives take least time (costmodel.terms.moe.moe_communication: the
    all-to-alls on ep's, the routed rows' gather and scatter on etp's), among the networks
    each group fits (all of them when it fits none: a lower bound still). Nothing else in a
    block reads these two networks, and a block's time (its forward, backward, recompute
    and the offload they leave exposed) never falls as either collective grows, so these
    choices give exactly the minimum over both network axes, without a grid axis each."""
    if c.model.moe_blocks and c.settings.moe_comm_overlap:
        # With the EP overlap a block's time depends on the ep network through the compute its
        # hidden part steals (the network's processor usage) as well as through the collective's
        # time, so the fastest collective need not give the fastest block: not searched exactly.
        raise InputError("moe_comm_overlap: the search does not take expert-parallel overlap yet (its network "
                         "choice would not be exact); evaluate such mappings with `mapsat eval`")
    size = np.asarray(c.net.size)
    tokens = keys.microbatch * c.model.seq / keys.cp
    spans = {name: span for name, _, span, _ in group_spans(keys)}
    out = {}
    for name, net in (("ep", "ep_net"), ("etp", "etp_net")):
        if not c.model.moe_blocks:
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


def _block_tables(c: Context, tm_keys: list, tp_overlaps: tuple, networks: int,
                  cp_comms: tuple = ALL_CP_COMMS, check: Callable[[], None] | None = None) -> dict:
    """The BLOCK_TABLES over the (tp, cp, ep, etp, microbatch) groups `tm_keys` (see Tables),
    minimised over the TP overlaps `tp_overlaps` and, where cp > 1, the CP communications
    `cp_comms` (codes; all of them when none is given). The groups with cp = 1 and those with
    cp > 1 are gridded apart: only the latter take the CP network and communication axes (a
    group of one reads neither), so those axes never multiply the cp = 1 groups' rows."""
    at = GROUP_DEGREES.index("cp")
    parts = [[k for k in tm_keys if k[at] == 1], [k for k in tm_keys if k[at] > 1]]
    wholes = [_group_tables(c, keys, tp_overlaps, networks, _block_net_axes(keys, networks),
                            list(cp_comms or ALL_CP_COMMS) if keys[0][at] > 1 else [0], check or _unlimited)
              for keys in parts if keys]
    whole = {name: np.concatenate([part[name] for part in wholes]) for name in wholes[0]}
    return _keyed_tables(c, [k for keys in parts for k in keys], whole)


def _unlimited() -> None:
    """A `check` that never stops the work."""


def _group_tables(c: Context, tm_keys: list, tp_overlaps: tuple, networks: int, block_nets: dict,
                  cp_comms: list, check: Callable[[], None]) -> dict[str, np.ndarray]:
    """_block_tables' arrays (key axis first: _keyed_tables) over groups `tm_keys` all with cp = 1 or all
    cp > 1: the grid's TP and CP network axes `block_nets` (_block_net_axes), CP communications `cp_comms`."""
    nets = list(range(networks))
    tm = np.array(tm_keys, dtype=float)
    # ---- block tables over (tp, cp, ep, etp, microbatch) × comm × overlap × redo ×
    # recompute × offloads × the TP and CP networks; the EP and ETP networks per key ----
    group_at = {name: i for i, name in enumerate(GROUP_DEGREES)}
    keys = _namespace(**{name: tm[:, i] for name, i in group_at.items()}, microbatch=tm[:, len(group_at)])
    expert_nets = best_expert_networks(c, keys, networks)
    offloads = _offload_codes(c)
    axes = dict(tp_comm=[0, 1, 2], tp_overlap=[0, 1, 2], cp_comm=cp_comms, seq_par_ag_redo=[False, True],
                recompute=list(RECOMPUTES), weight_offload=offloads,
                activations_offload=offloads, **{net: list(axis) for net, axis in block_nets.items()})
    grids = redo_grids(axes)
    # (evaluated a few keys at a time and reduced to what the tables keep per key: the
    # block's terms over the whole grid would take gigabytes)
    size = np.asarray(c.net.size)
    rows_per_key = sum(math.prod(len(axis) for axis in grid.values()) for grid in grids)
    keys_per_chunk = max(1, TABLE_CHUNK_ROWS // rows_per_key)
    networks_axes = tuple(block_nets)
    # memory at no offload, TP overlap and networks at their first values (it reads none of them)
    first = dict(tp_overlap=0, weight_offload=False, activations_offload=False, **{net: 0 for net in block_nets})

    def reduced(chunk: Named, rows: dict) -> dict[str, Named]:
        """A chunk of keys' grid rows reduced to what each table keeps per key (key axis first)."""
        fits = chunk.of(rows["fits"])

        def by_flags(values) -> Named:
            # minimised over the networks that fit and (TP overlap only changes time: the best
            # the space offers bounds every one) the TP overlaps offered; and the CP
            # communications (which change time and the workspace only: their minimum bounds
            # every one)
            return chunk.of(values).min(*networks_axes, "cp_comm", where=fits).sel(
                tp_overlap=list(tp_overlaps)).min("tp_overlap")

        return {"block": by_flags(rows["block"]), "block_zb": by_flags(rows["block_zb"]),
                "compute": chunk.of(rows["compute"]).min(),
                "head": chunk.of(rows["head"]).min(),
                "p2p": chunk.of(rows["p2p"]).min(),
                **reduced_kind_rows(rows, lambda values: chunk.of(values).sel(**first).min("cp_comm"), by_flags)}

    parts: dict[str, list] = {}
    for first_key in range(0, len(tm), keys_per_chunk):
        check()
        key = np.arange(first_key, min(len(tm), first_key + keys_per_chunk))
        tables = []
        for grid in grids:
            cols, chunk = Named.open_grid(key=key, **grid)
            tables.append(reduced(chunk, _block_rows(c, tm, cols, group_at, expert_nets, size, nets)))
        for name, whole in tables[0].items():
            parts.setdefault(name, []).append(with_redo(whole, *(table[name] for table in tables[1:])))
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


REDO = "seq_par_ag_redo"
_REDO_FREE = next(dim for dim in DIMENSIONS if dim.name == REDO).free_when


def redo_grids(axes: dict) -> list[dict]:
    """The block grid `axes` as the product grids that hold its rows a mapping can take of the
    sequence-parallel AG redo: the redo off at every code of the flags it is free by (the
    declaration's free_when: TP communication and recompute), and on (when offered) only at the
    codes it is free at, a product too. The rows with the redo on elsewhere, a third of the whole
    product, are never evaluated (with_redo)."""
    if any(cond.subject not in axes for cond in _REDO_FREE):
        raise ValueError(f"{REDO} is free by {', '.join(cond.subject for cond in _REDO_FREE)}; the block grid "
                         f"has axes {', '.join(axes)}")
    grids = [{**axes, REDO: [False]}]
    if True in axes[REDO]:
        free = {name: [code for code in axes[name] if all(cond.holds_for(code) for cond in _REDO_FREE
                                                           if cond.subject == name)]
                for name in {cond.subject for cond in _REDO_FREE}}
        if all(free.values()):
            grids.append({**axes, **free, REDO: [True]})
    return grids


def with_redo(off: Named, on: Named | None = None) -> np.ndarray:
    """One table over the whole block grid's flags from its parts' (redo_grids): the rows with the
    redo on where it is free from `on`, the redo-off rows' values at the rest of the redo-on
    product (no mapping takes them: the space keeps the redo off there), and a table minimised
    over every flag the least of both parts'."""
    if REDO not in off.axes:
        return off.values if on is None else np.minimum(off.values, on.values)
    at = list(off.axes).index(REDO)
    whole = np.repeat(off.values, 2, axis=at)
    if on is not None:
        at_codes = [[1] if name == REDO else range(len(codes)) if codes == off.axes[name]
                    else [off.axes[name].index(code) for code in codes] for name, codes in on.axes.items()]
        whole[np.ix_(*at_codes)] = on.values
    return whole


def _offload_codes(c: Context) -> list[bool]:
    """The offload switches the block grid evaluates: both with an offload tier; without one,
    off only. A block's offload switches change nothing but its offload traffic's exposed time,
    and with no tier that traffic takes no time (block_offload.offload_rate: an infinite rate),
    so the rows with a switch on equal those with it off (_keyed_tables shares them)."""
    return [False, True] if c.memory.offload_bytes_per_s > 0 else [False]


FLAG_AXES = {"tp_comm": (0, 1, 2), "seq_par_ag_redo": (False, True), "recompute": RECOMPUTES,
             "weight_offload": (False, True), "activations_offload": (False, True)}
"""The axes the block time arrays keep after the key (_group_tables' grid, in its order, less
those minimised over); the memory arrays (stored, workspace) keep the first three."""


def _keyed_tables(c: Context, tm_keys: list, whole: dict[str, np.ndarray]) -> dict:
    """_group_tables' arrays over groups `tm_keys` as tables read by group (Keyed), by their axes: with every
    FLAG_AXES, one per combination of BLOCK_FLAGS; with the first three (memory), one per
    recompute setting and activation class (ACT_CLASSES); with the key alone, one."""
    positions = {key: at for at, key in enumerate(tm_keys)}

    def by_tm(values: np.ndarray) -> Keyed:
        return Keyed(positions, values)
    def by_flags_first(values: np.ndarray) -> np.ndarray:     # (one copy, key axis last)
        return np.ascontiguousarray(values.reshape(len(values), -1).T).reshape(*values.shape[1:], -1)
    def by_block_flags(values: np.ndarray) -> dict:
        # (offload switches evaluated off only, _offload_codes: the tables with one on are those with it off)
        rows, tables = by_flags_first(values), {}
        for comm, redo, rc, w, a in itertools.product(range(3), (0, 1), RECOMPUTES, (0, 1), (0, 1)):
            at = (comm, redo, RECOMPUTES.index(rc), min(w, rows.shape[3] - 1), min(a, rows.shape[4] - 1))
            tables[comm, redo, rc, w, a] = (by_tm(rows[at]) if at[3:] == (w, a) else tables[comm, redo, rc, 0, 0])
        return tables
    def by_class(values: np.ndarray) -> dict:
        rows = by_flags_first(values)
        return {(rc, cls): by_tm(rows[comm, int(redo), RECOMPUTES.index(rc)])
                for rc in RECOMPUTES for cls, (comm, redo) in ACT_CLASS_ROWS.items()}
    # the output layer's 3 passes (backward twice the forward); overlapped sends' exposed part can be 0 (pipeline_time)
    scale = {"head": 3, "p2p": 0.0 if c.settings.pp_comm_overlap else 1.0}
    readers = {1 + len(FLAG_AXES): by_block_flags, 4: by_class, 1: by_tm}
    return {name: readers[values.ndim](values * scale[name] if name in scale else values)
            for name, values in whole.items()}


def _block_rows(c: Context, tm: np.ndarray, cols: dict, group_at: dict, expert_nets: dict,
                size: np.ndarray, nets: list) -> dict[str, np.ndarray]:
    """A chunk of the block grid (`cols`, its rows): what the block tables keep of one block's terms (its
    time, in a ZB-H1 bubble too, compute, output layer, sends, stored activations and
    workspace) and whether its TP and CP groups fit their networks (evaluate.network_checks;
    a group of one fits any: a mapping putting a group on a network too small for it is
    infeasible, so the minimum over the networks only needs to run over those that fit)."""
    key = cols["key"]
    ns = array_fields(MappingArrays.of(**{**_DEFAULT_COLUMNS, **{k: v_ for k, v_ in cols.items() if k != "key"},
                                          **{name: tm[key, i] for name, i in group_at.items()},
                                          "microbatch": tm[key, len(group_at)],
                                          **{net: best[key] for net, best in expert_nets.items()}}))
    blk, kind_rows = kind_block_rows(c, ns)            # (the mean block; kind_floors: each kind's rows)
    total = blk.block_fwd_s + blk.block_bwd_s + blk.recompute_s + blk.offload_fwd_s + blk.offload_bwd_s
    fits = np.ones((), dtype=bool)
    for name, degree, span, net in group_spans(ns):
        if name in GRID_NETWORKS:
            fits = fits & ((degree == 1) | (span <= size[net]))
    fits = fits & cp_comm_heads_fit(c, ns)
    p2p = functools.reduce(np.minimum, [collective_s(c, ArrayOps, Collective.p2p, 2.0, blk.act_message_bytes / ns.tp,
                                                     np.intp(k)) for k in nets])
    # one block, one microbatch, forward + backward + recompute + exposed TP and offload (exact per flag
    # combination it reads); in a ZB-H1 bubble, less twice its weight-gradient GEMMs (terms.iteration)
    out = {"block": total, "compute": blk.compute_fwd_s + blk.compute_bwd_s, "head": output_layer_s(c, ns, ArrayOps),
           "p2p": p2p, "fits": fits}
    if not kind_rows:                 # (several kinds: the least kind's rows, kind_floors.least_kind_rows)
        out.update(block_zb=total - 2 * blk.weight_grad_gemm_s, stored=blk.activations.stored,
                   workspace=blk.activations.workspace)
    return {**out, **kind_rows}
