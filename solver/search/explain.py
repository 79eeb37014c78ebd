"""Why the best mapping wins: the certified best time for every value of every dimension.

For each dimension of the space (costmodel.space.dimensions) and each value it takes, the best
mapping with that one value fixed, certified like `solve`'s answer. One CP-SAT model of the
space serves every question: the value is an *assumption* (a literal CP-SAT must take for
that solve only), and so is each round's "beat the best so far" bound; every block the
exact model scores is cut from the model once and kept, so later questions start from what
earlier ones scored. A question on a flag CP-SAT does not decide (TP overlap, DP overlap,
networks) needs no literal: the exact scoring of a block tries every value and keeps the
pinned ones, and the surrogate, a lower bound over all of them, bounds the pinned ones too.

Certification is `solve`'s: the best scored mapping with the value fixed is optimal once
CP-SAT proves (under the assumption) that no unscored block's surrogate bound can beat it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from collections.abc import Callable

from ortools.sat.python import cp_model

from costmodel.space.dimensions import BY_NAME, DIMENSIONS, GROUP_SPAN, NETWORK_GROUPS
from costmodel.evaluate import Evaluation, evaluate_in_context
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.search.cpsat.constraints import group_span_expressions
from solver.search.engine import Engine, Key, Question
from solver.search.solve import SolverConfig, binding_constraints
from solver.space.count import count_mappings
from solver.space.declaration import Space, coarse_facts, facts
from solver.space.flags import flag_projection
from solver.space.pins import pinned

PINNED_WARM_START_BLOCKS = 4096
"""With a split dimension pinned, at most this many compatible blocks are scored before the
first CP-SAT round (each is a few thousand mappings)."""
TIE_REL = 1e-9
"""Times within this relative distance of the winner's are ties (solve = brute tolerance)."""



@dataclass(frozen=True)
class ValueBest:
    """The best mapping with one dimension fixed to one value."""

    dimension: str
    value: int                    # a number, or a flag's code
    label: str                    # as people read it
    best: Evaluation | None       # None: no mapping with this value is feasible
    certified: bool               # optimal (or infeasible) proven
    seconds: float

    def to_dict(self) -> dict:
        best = self.best
        return {"dimension": self.dimension, "value": self.label, "certified": self.certified,
                "iteration_time_s": best.iteration_time_s if best else None, "mfu": best.mfu if best else None,
                "mapping": best.mapping.model_dump(mode="json") if best else None, "seconds": self.seconds}


@dataclass(frozen=True)
class Explanation:
    """The certified best per value of each dimension, the winner and the runner-up (the
    fastest mapping any other value allows) with what binds each."""

    winner: Evaluation | None
    rows: list[ValueBest]
    runner_up: ValueBest | None
    winner_binding: list[str] = field(default_factory=list)
    runner_up_binding: list[str] = field(default_factory=list)
    seconds: float = 0.0
    blocks_scored: int = 0
    interrupted: bool = False
    """Ctrl-C stopped it: `rows` are the values proven before, the others are missing"""

    @property
    def certified(self) -> bool:
        return not self.interrupted and all(row.certified for row in self.rows)

    def to_dict(self) -> dict:
        winner = self.winner
        return {"winner": None if winner is None else {"mapping": winner.mapping.model_dump(mode="json"),
                                                       "iteration_time_s": winner.iteration_time_s,
                                                       "mfu": winner.mfu},
                "winner_binding": self.winner_binding,
                "runner_up": None if self.runner_up is None else self.runner_up.to_dict(),
                "runner_up_binding": self.runner_up_binding, "rows": [r.to_dict() for r in self.rows],
                "certified": self.certified, "blocks_scored": self.blocks_scored, "seconds": self.seconds,
                "partial": self.interrupted}


FLOOR_FLAGS = ("zero", "sched", "recompute", "tp_comm", "seq_par_ag_redo", "weight_offload", "activations_offload",
               "shard")
"""The flags the block floors read (solver.search.cpsat.tables.block_lower_bounds): a
question pinning one gets floors of its own."""


class Explorer(Engine):
    """One CP-SAT model of a space, asked for the best mapping under a pinned value at a time."""

    def __init__(self, model: Model, system: System, num_gpus: int, max_batch: int, datatype: Datatype,
                 space: Space, kernels: Kernels, config: SolverConfig):
        super().__init__(model, system, num_gpus, max_batch, datatype, space, kernels, workers=config.workers,
                         seed=config.seed)
        self.config = config
        self.literals: dict[tuple[str, int], cp_model.IntVar] = {}   # one assumption literal per pin
        self._offers: dict[tuple, bool] = {}     # (split, flag, code) -> whether the split can take it
        self._keys_by_value: dict[str, dict[int, frozenset]] = {}   # split dimension -> value -> its blocks
        self._pinned_floors = None               # the block floors of every pin, made with the first (PinnedFloors)

    def _held(self, key: Key, name: str) -> int:
        """The block's value of split dimension `name`."""
        own = {"interleaving": key.interleaving, "microbatch": key.microbatch}
        return own[name] if name in own else getattr(self.plan.skeletons[self.index[key.split]], name)

    def _allowed(self, name: str | None, value: int | None) -> Callable[[Key], bool]:
        """Whether a block can hold a feasible mapping with the pinned value: a split value
        must be the block's own; a flag value must be in the split's flag table (the
        space's rules), and a network must hold the group it carries (evaluate's network
        check), or no mapping of the block takes it feasibly. The search asks it of every block
        many times, so the engine's blocks holding each value of a split dimension are grouped
        once (a flag's answer is kept per split by `_flag_offers`)."""
        if name is None:
            return lambda key: True
        if BY_NAME[name].is_flag:
            return lambda key: self._flag_offers(key.split, name, value)
        universe = self.block_floors
        if name not in self._keys_by_value:
            groups: dict[int, set] = {}
            for key in universe:
                groups.setdefault(self._held(key, name), set()).add(key)
            self._keys_by_value[name] = {held: frozenset(keys) for held, keys in groups.items()}
        allowed = self._keys_by_value[name].get(value, frozenset())
        return lambda key: key in allowed if key in universe else self._held(key, name) == value

    def _flag_offers(self, split: tuple, name: str, value: int) -> bool:
        if (split, name, value) not in self._offers:
            skeleton = self.plan.skeletons[self.index[split]]
            known = dict(coarse_facts(facts(skeleton, self.problem.system)))
            offers = (value,) in flag_projection(self.plan.space, (name,), known, len(self.problem.system.networks))
            for degree_name, net_name in NETWORK_GROUPS:
                degree = getattr(skeleton, degree_name)
                if net_name == name and degree > 1:
                    span = math.prod(getattr(skeleton, factor) for factor in GROUP_SPAN[degree_name])
                    offers &= span <= self.problem.system.networks[value].size
            self._offers[(split, name, value)] = offers
        return self._offers[(split, name, value)]

    def _assumption(self, name: str | None, value: int | None) -> list:
        """The literal CP-SAT must take for the pin. A flag CP-SAT does not decide gets one
        that implies what the pin needs of the split: a degree > 1 for a value other than the
        pinned-by-default first code, and for a network, that the group fits it."""
        if name is None:
            return []
        if (name, value) not in self.literals:
            self.literals[(name, value)] = self._pin_literal(name, value)
        return [self.literals[(name, value)]]

    def _pin_literal(self, name: str, value: int):
        v, m, dim = self.v, self.m, BY_NAME[name]
        if name in v.flags:
            return v.flags[name][value] if value in v.flags[name] else m.NewConstant(0)
        if name == "batch":
            lit = m.NewBoolVar(f"batch_is[{value}]")
            m.Add(v.batch == value).OnlyEnforceIf(lit)
            return lit
        if not dim.is_flag:
            one_hot = getattr(v, name)
            return one_hot.is_.get(value, m.NewConstant(0))
        lit = m.NewBoolVar(f"pin_{name}[{dim.label_of(value)}]")
        degree_gt1 = {fact: (getattr(v, fact).is_[1].Not() if 1 in getattr(v, fact).is_ else m.NewConstant(1))
                      for fact, _ in NETWORK_GROUPS}
        if value != dim.codes(v.num_networks)[0]:
            for cond in dim.free_when:
                if cond.subject in degree_gt1:
                    m.AddImplication(lit, degree_gt1[cond.subject])
        spans = group_span_expressions(v, self.problem.num_gpus)
        for (fact, net), span in zip(NETWORK_GROUPS, spans, strict=True):
            if net == name:
                size = self.problem.system.networks[value].size
                if isinstance(span, int):
                    if span > size:
                        m.AddBoolOr([lit.Not(), degree_gt1[fact].Not()])
                else:
                    m.Add(span <= size).OnlyEnforceIf([lit, degree_gt1[fact]])
        return lit

    # ---- one question ----
    def best(self, name: str | None = None, value: int | None = None) -> tuple[Evaluation | None, bool]:
        """The certified best mapping with dimension `name` fixed to `value` (None: no pin),
        and whether it is proven (or its absence proven). A pinned split dimension leaves few
        compatible blocks, so the warm start scores more of them before CP-SAT rounds."""
        flag_pin = name is not None and BY_NAME[name].is_flag
        split_pin = name in BY_NAME and not BY_NAME[name].is_flag
        return self.best_of(Question(
            blocks=self._allowed(name, value),
            rows=(lambda block: block.flags[name] == value) if flag_pin else None,
            assumptions=tuple(self._assumption(name, value)),
            ranked=self._pinned_ranking(name, value) if name in FLOOR_FLAGS else None,
            warm_start_blocks=PINNED_WARM_START_BLOCKS if split_pin else None))

    def _pinned_ranking(self, name: str, value: int) -> list | None:
        """The block floors with flag `name` pinned to `value`: the floors read these flags
        (FLOOR_FLAGS), so with one fixed each is the least over the mappings the question
        allows, a lower bound of theirs as the engine's floors are of all."""
        from solver.search.cpsat.block_floors import PinnedFloors
        if any(pinned_name == name for pinned_name, _ in self.plan.space.pins):
            return None                # (--fix already narrowed it: the engine's floors read that)
        if self._pinned_floors is None:
            self._pinned_floors = PinnedFloors(self.tables, self.c, self.plan.space, self.plan.skeletons,
                                               self.local_batch, self.c.memory.offload_capacity_bytes > 0,
                                               len(self.problem.system.networks), self.c.memory.hbm_capacity_bytes)
        return self._pinned_floors.ranked(pinned(self.plan.space, ((name, (value,)),)))

    def best_of(self, question: Question) -> tuple[Evaluation | None, bool]:
        """The certified best mapping a question allows (None: none is feasible), within the
        configured time limit, and whether it is proven; Ctrl-C stops the whole explanation."""
        found = self.search(dataclasses.replace(question, time_limit_s=self.config.time_limit_s))
        if found.interrupted:
            raise KeyboardInterrupt
        if not found.groups:
            return None, found.certified
        return evaluate_in_context(self.c, self.mapping(*found.groups[0][0])), found.certified


def explain(model: Model, system: System, num_gpus: int, *, max_batch: int, datatype: Datatype, space: Space,
            kernels: Kernels = Kernels(), config: SolverConfig = SolverConfig(),
            dimensions: tuple[str, ...] | None = None, progress=None) -> Explanation:
    """The certified best time for each value of each dimension (all that take more than one
    value in the space, or `dimensions`), the winner and the runner-up. `progress(text)`, if
    given, hears which value is being proven."""
    say = progress or (lambda text: None)
    started = time.perf_counter()
    counted = count_mappings(model, system, num_gpus, max_batch, space)
    if not counted.mappings:      # no split passes the rules: nothing to explain
        return Explanation(winner=None, rows=[], runner_up=None, seconds=time.perf_counter() - started)
    explorer = Explorer(model, system, num_gpus, max_batch, datatype, space, kernels, config)
    say("the best mapping")
    winner, _ = explorer.best()
    rows: list[ValueBest] = []
    try:
        _prove_each_value(explorer, counted, winner, dimensions, rows, say)
        interrupted = False
    except KeyboardInterrupt:          # Ctrl-C: the values proven so far
        interrupted = True
    # the runner-up: the fastest mapping some other value allows that is slower than the
    # winner (equally fast ones are ties: a setting with no effect, or an exact coincidence)
    slower = [r for r in rows if r.best is not None and winner is not None
              and r.best.iteration_time_s > winner.iteration_time_s * (1 + TIE_REL)]
    runner_up = min(slower, key=lambda r: r.best.iteration_time_s, default=None)
    return Explanation(
        winner=winner, rows=rows, runner_up=runner_up,
        winner_binding=binding_constraints(explorer.problem, winner) if winner else [],
        runner_up_binding=binding_constraints(explorer.problem, runner_up.best) if runner_up else [],
        seconds=time.perf_counter() - started, blocks_scored=len(explorer.scored), interrupted=interrupted)


def _prove_each_value(explorer: Explorer, counted, winner: Evaluation | None, dimensions: tuple[str, ...] | None,
                      rows: list[ValueBest], say) -> None:
    """Append to `rows` the certified best of each value of each wanted dimension, in order
    (as they are proven: Ctrl-C leaves those before it)."""
    wanted = dimensions or tuple(d.name for d in DIMENSIONS)
    for dim in DIMENSIONS:
        values = counted.by_dimension.get(dim.name, {})
        if dim.name not in wanted or len(values) < 2:
            continue
        for label in values:
            value = _value_of(dim.name, label)
            begun = time.perf_counter()
            say(f"{dim.name} = {label} (value {len(rows) + 1})")
            if winner is not None and _code(dim.name, winner.mapping.value(dim.name)) == value:
                best, certified = winner, True
            else:
                best, certified = explorer.best(dim.name, value)
            rows.append(ValueBest(dim.name, value, label, best, certified, time.perf_counter() - begun))


def _value_of(name: str, label: str) -> int:
    dim = BY_NAME[name]
    if not dim.is_flag:
        return int(label)
    return next(code for code in dim.codes(int(label) + 1 if dim.kind == "network" else 0) if dim.label_of(code) == label)


def _code(name: str, value) -> int:
    dim = BY_NAME[name]
    return dim.code_of(value) if dim.is_flag else int(value)
