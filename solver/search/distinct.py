"""Distinct top-k: mappings that a setting without effect tells apart are one answer.

Two mappings are *equivalent* when they share the skeleton (tp, pp, dp, batch,
interleaving, microbatch) and their exact iteration time and memory (HBM and offload
bytes) are equal — the flags that differ change nothing (the TP communication at tp 1,
attn_only against none under fused attention, ...). Brute force and the solver both rank
*groups* of equivalent mappings by (time, smallest ordinal) and keep the best k groups, so
`--top-k` counts distinct answers; each group is shown once, by its first-enumerated
member, with the settings its members take (`equivalents`).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from costmodel.space.dimensions import BY_NAME, DIMENSIONS, BlockKey
from costmodel.encoding import MappingArrays

SKELETON = tuple(dim.name for dim in DIMENSIONS if not dim.is_flag)
FLAGS = tuple(dim for dim in DIMENSIONS if dim.is_flag)
ROUNDING_BITS = 10
"""Times and bytes compare with the last 10 of their 52 mantissa bits dropped (~2e-13
relative), so a sum rounded another way is still equal."""


def group_keys(rows: MappingArrays, time_s: np.ndarray, hbm_bytes: np.ndarray,
               offload_bytes: np.ndarray) -> np.ndarray:
    """One int64 row per mapping: the skeleton's values, then time and memory as rounded bits."""
    exact = [np.ascontiguousarray(np.asarray(x, dtype=np.float64)).view(np.int64) >> ROUNDING_BITS
             for x in (time_s, hbm_bytes, offload_bytes)]
    return np.column_stack([rows.columns[name].astype(np.int64) for name in SKELETON] + exact)


def top_groups(time_s: np.ndarray, ordinal: np.ndarray, keys: np.ndarray, top_k: int) -> list[np.ndarray]:
    """The best top_k groups of equal keys, ranked by (time, smallest ordinal): each an index
    array into the inputs, its first-enumerated member first. Only the fastest rows are
    sorted (a multiple of top_k, widened until top_k groups are found), so this stays near linear."""
    n = len(time_s)
    if top_k <= 0 or n == 0:
        return []
    width = min(n, 16 * top_k)
    while True:
        if width < n:
            cutoff = np.partition(time_s, width - 1)[width - 1]
            candidates = np.flatnonzero(time_s <= cutoff)
        else:
            candidates = np.arange(n)
        ranked = candidates[np.lexsort((ordinal[candidates], time_s[candidates]))]
        groups: dict[bytes, list[int]] = {}
        for i in ranked.tolist():       # in rank order, so each group's first member is its best
            groups.setdefault(keys[i].tobytes(), []).append(i)
        if len(groups) >= top_k or width == n:
            return [np.asarray(members, dtype=np.int64) for members in list(groups.values())[:top_k]]
        width = min(n, 4 * width)


def equivalents(columns: Mapping[str, np.ndarray], members: np.ndarray) -> dict[str, list[str]]:
    """The flags a group's members set differently, each with the values they take
    (`columns`: each flag's codes, e.g. MappingArrays.columns)."""
    out = {}
    for dim in FLAGS:
        codes = np.unique(columns[dim.name][members].astype(np.int64))
        if len(codes) > 1:
            out[dim.name] = [dim.label_of(int(code)) for code in codes]
    return out


def equivalents_text(settings: dict[str, list[str]]) -> str:
    """"tp-comm ar|p2p_rs_ag|rs_ag; ag-redo off|on" (table labels), or "" when none."""
    return "; ".join(f"{BY_NAME[name].header} {'|'.join(values)}" for name, values in settings.items())


class TopGroups:
    """The K best groups of equivalent qualifying mappings, by (time, smallest ordinal)."""

    def __init__(self, top_k: int):
        self.k = top_k
        self.time_s = np.zeros(0)
        self.ordinal = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros((0, len(SKELETON) + 3), dtype=np.int64)
        self.block = np.zeros(0, dtype=np.int64)      # index into self.blocks
        self.row = np.zeros(0, dtype=np.int64)        # the mapping's j in its scored block
        self.blocks: list[BlockKey] = []
        self.groups: list[np.ndarray] = []

    @property
    def target_s(self) -> float:
        """The time a new mapping must beat (or tie) to enter the top K groups."""
        return float(self.time_s[self.groups[-1][0]]) if len(self.groups) == self.k else math.inf

    def offer(self, key: BlockKey, skeleton_values: tuple, block, mask: np.ndarray | None) -> None:
        ok = block.time_s <= self.target_s       # a slower mapping cannot enter a full top K
        if mask is not None:
            ok &= mask
        js = np.flatnonzero(ok)
        if not len(js):
            return
        exact = [np.ascontiguousarray(x[js], dtype=np.float64).view(np.int64) >> ROUNDING_BITS
                 for x in (block.time_s, block.hbm_bytes, block.offload_bytes)]
        keys = np.column_stack([np.full(len(js), value, dtype=np.int64) for value in skeleton_values] + exact)
        self.blocks.append(key)
        time_all = np.concatenate([self.time_s, block.time_s[js]])
        ord_all = np.concatenate([self.ordinal, block.ordinal[js]])
        keys_all = np.concatenate([self.keys, keys])
        block_all = np.concatenate([self.block, np.full(len(js), len(self.blocks) - 1, dtype=np.int64)])
        row_all = np.concatenate([self.row, js])
        groups = top_groups(time_all, ord_all, keys_all, self.k)
        keep = np.concatenate(groups)
        self.time_s, self.ordinal, self.keys = time_all[keep], ord_all[keep], keys_all[keep]
        self.block, self.row = block_all[keep], row_all[keep]
        sizes = np.cumsum([0] + [len(g) for g in groups])
        self.groups = [np.arange(a, b) for a, b in zip(sizes[:-1], sizes[1:])]

    def members(self) -> list[list[tuple[BlockKey, int]]]:
        """Each group as (block, row j) pairs, its first-enumerated member first."""
        return [[(self.blocks[self.block[i]], int(self.row[i])) for i in g] for g in self.groups]
