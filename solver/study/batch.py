"""Batches of problems: the batch file, its schema and its grid expansion into problems.
Solving them is solver.runner.

The batch file format is described field by field in docs/batch-files.md.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

import costmodel.inputs.limits as limits
from costmodel.terms.context import Context
from costmodel.errors import InputError
from costmodel.inputs.headroom import Headroom
from costmodel.inputs.kernels import ATTENTION_KERNELS, GRAD_DATATYPES, PRECISION_DEFAULTS, Kernels
from costmodel.inputs.load import describe_validation_error, load_model, load_system, other_file_kind, parse, read_document
from costmodel.inputs.model import Boolean, Model, RealNumber, within
from costmodel.inputs.precision import OPTIMIZER_STATES, Precision
from costmodel.inputs.advice import datatype_hint
from costmodel.inputs.system import Datatype, System
from costmodel.inputs.units import GiB
from solver.space.declaration import SPACES
from solver.space.pins import BATCH_CAP, default_batch_cap, parse_pins

DEFAULT_MAX_BATCH = BATCH_CAP
"""The cap a problem id leaves unsaid: others appear as b<cap> (the default below 3,072 at long
sequences too: ...__b2048)."""
DEFAULT_SPACE = "full"
DEFAULT_TIME_LIMIT_S = 120.0
UNBOUNDED = "unbounded"
MAX_PROBLEMS = 10_000
"""Problems one batch file may expand to: at a second or more per solve, a larger grid runs for
days and is better split into files (each resumable on its own)."""
DATATYPE_TAGS = {"float8": "fp8", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _as_list(value: Any) -> Any:
    """A scalar stands for a one-element list; lists expand to the grid."""
    return value if isinstance(value, list) else [value]


def Grid(item: Any) -> Any:  # noqa: N802 - reads like a type in the schema below
    return Annotated[list[item], BeforeValidator(_as_list), Field(min_length=1)]


def _named_datatype(value: Any) -> Any:
    """A short datatype name (fp8, bf16) is refused with the field values that mean it."""
    hint = datatype_hint(value, "datatype:", "precision:") if value not in tuple(Datatype) else None
    if hint is not None:
        raise ValueError(f"unknown datatype {value!r}: {hint}")
    return value


_OFFLOAD_GIB = limits.Bound(0, limits.CAPACITY_GIB.high, limits.CAPACITY_GIB.reason + "; 0 removes it")
_BATCH_CONFIG = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Overrides(BaseModel):
    """The co-design knobs of `System.with_overrides`; each a value or a list of values."""

    model_config = _BATCH_CONFIG

    hbm_gib: Grid(Annotated[RealNumber, Field(gt=0), within(limits.CAPACITY_GIB)]) | None = Field(None, description="HBM capacity per GPU, GiB.")
    offload_gib: Grid(Annotated[RealNumber, Field(ge=0), within(_OFFLOAD_GIB)]) | None = Field(
        None, description="Offload memory per GPU, GiB; 0 = none.")
    offload_gbps: Grid(Annotated[RealNumber, Field(gt=0), within(limits.BANDWIDTH_GBPS)] | Literal["unbounded"]) | None = Field(
        None, description="Offload bandwidth per GPU per direction, GB/s, or 'unbounded' (as fast as HBM).")
    nvlink_size: Grid(Annotated[int, Field(gt=0, strict=True), within(limits.NETWORK_SIZE)]) | None = Field(
        None, description="Size of the first network (the NVLink domain), GPUs.")
    runtime_reserve_gib: Grid(Annotated[RealNumber, Field(ge=0), within(limits.CAPACITY_GIB_OR_ZERO)]) | None = Field(
        None, description="HBM per GPU kept by the runtime, GiB (0: none, as the 2023 paper counted).")


class GridSpec(BaseModel):
    """One grid of problems: every combination of the listed values."""

    model_config = _BATCH_CONFIG

    models: Grid(str | dict[str, Any]) | None = Field(
        None, description="Model files (relative to the batch file) or inline models (with a name).")
    systems: Grid(str | dict[str, Any]) | None = Field(
        None, description="System files (relative to the batch file) or inline systems (with a name).")
    gpus: Grid(Annotated[int, Field(gt=0, strict=True), within(limits.GPUS_SEARCH)]) | None = Field(
        None, description="GPU counts.")
    seq_size: Grid(Annotated[int, Field(gt=0, strict=True), within(limits.SEQ_SIZE)]) | None = Field(
        None, description="Training sequence lengths, tokens: required with a Hugging Face config.json model; "
                          "replaces a model file's seq_size.")
    max_batch: Grid(Annotated[int, Field(gt=0, strict=True), within(limits.MAX_BATCH_SEARCH)]) | None = Field(
        None, description="Caps on the global batch, in sequences (default: the largest power of two within 2^24 "
                          f"tokens, at most {DEFAULT_MAX_BATCH}; {DEFAULT_MAX_BATCH} in the paper spaces).")
    batch: Grid(Annotated[int, Field(gt=0, strict=True), within(limits.MAX_BATCH_SEARCH)]) | None = Field(
        None, description="Fixed global batches, in sequences (instead of a cap): only splits whose dp divides it.")
    fix: dict[str, int | str | bool | list[int | str | bool]] | None = Field(
        None, description="Dimensions to fix, as on the command line: {tp: 8, recompute: [full, none]}.")
    datatype: Grid(Annotated[Datatype, BeforeValidator(_named_datatype)]) | None = Field(
        None, description="Compute datatypes (default bfloat16).")
    space: Grid(Literal[tuple(SPACES)]) | None = Field(None, description=f"Mapping spaces (default {DEFAULT_SPACE}).")
    attention: Grid(Literal[ATTENTION_KERNELS]) | None = Field(
        None, description="Attention kernels: fused (FlashAttention, the default) or unfused.")
    grad_datatype: Grid(Literal[GRAD_DATATYPES]) | None = Field(
        None, description="Gradient datatypes: float32 main gradients (Megatron-LM, the default) or 16bit "
                          "(DeepSpeed, the ZeRO paper).")
    capacity_factor: Grid(Annotated[RealNumber, within(limits.CAPACITY_FACTOR)]) | None = Field(
        None, description="Mixture-of-experts capacity factors: the busiest expert's tokens over the mean (default "
                          "1.0, perfect balance; Switch Transformer's 1.25). Dense models ignore it.")
    precision: Grid(Literal[tuple(p.value for p in Precision)]) | None = Field(
        None, description="Precision recipes (Megatron-LM's --fp8-recipe / --fp4-recipe names; default none: the "
                          "datatype alone decides every byte). Each system must run it; datatype stays bfloat16.")
    optimizer_state: Grid(Literal[OPTIMIZER_STATES]) | None = Field(
        None, description="Adam's moments in fp32 (the default) or bf16.")
    low_precision_param_gather: Grid(Boolean) | None = Field(
        None, description="With an FP8/FP4 recipe: weights kept and all-gathered in its format (default: as "
                          "Megatron-Bridge's recipe sets it).")
    bf16_first_last_blocks: Grid(Annotated[int, Field(ge=0, strict=True), within(limits.NUM_BLOCKS_OR_NONE)]) | None = (
        Field(None, description="With an FP8/FP4 recipe: blocks at each end kept in BF16 (default 0)."))
    overrides: Overrides | None = Field(None, description="System overrides, each a value or a list.")
    hbm_headroom: Annotated[str, Field(max_length=40)] | Annotated[RealNumber, Field(ge=0)] | None = Field(
        None, description="HBM each GPU must leave free beyond the runtime reserve, as --hbm-headroom takes it: "
                          "GiB (4, \"4GiB\") or a percentage of the HBM capacity (\"5%\"). Default 0.")
    time_limit_s: Annotated[RealNumber, within(limits.TIME_LIMIT_S)] | None = Field(None, gt=0, description=f"Solver time limit per problem, s "
                                                                f"(default {DEFAULT_TIME_LIMIT_S:g}).")


class BatchFile(GridSpec):
    """A batch file: its top-level fields are a grid, or the defaults of every entry of `grids`."""

    name: str | None = Field(None, description="A label (default: the file name).")
    description: str | None = Field(None, description="Free text: what the batch reproduces or asks.")
    grids: list[GridSpec] | None = Field(None, min_length=1, description="Several grids sharing the top-level values.")


@dataclass(frozen=True)
class Problem:
    """One fully resolved problem: the model, the system with its overrides applied, and the
    search settings."""

    id: str
    model: Model
    system: System
    system_name: str           # before overrides (the system's own name)
    system_source: str         # the file as written in the batch file, or "inline"
    overrides: dict[str, Any]  # as given (only the keys set)
    gpus: int
    max_batch: int
    datatype: Datatype
    space: str
    time_limit_s: float
    offload_unbounded: bool = False  # offload bandwidth = HBM's, standing for "unbounded"
    attention: str = "fused"         # the attention kernel (costmodel.inputs.kernels.ATTENTION_KERNELS)
    fix: tuple[str, ...] = ()        # pins as --fix takes them ("tp=8"); a fixed batch is "batch=B"
    grad_datatype: str = "float32"   # how gradients are kept (costmodel.inputs.kernels.GRAD_DATATYPES)
    capacity_factor: float = 1.0     # MoE load imbalance (costmodel.inputs.kernels.Kernels.capacity_factor)
    precision: dict = field(default_factory=dict)  # the precision settings not at their defaults (Kernels.precision_record)

    @property
    def kernels(self) -> Kernels:
        """The problem's settings that are not searched."""
        return Kernels.with_attention(self.attention, self.grad_datatype, self.capacity_factor, **self.precision)

    def to_dict(self) -> dict:
        """The `problem` field of a result record: everything needed to read the result."""
        offload = self.system.offload
        return {
            "model": {**self.model.model_dump(mode="json"), "params": self.model.total_params},
            "system": {"name": self.system_name, "source": self.system_source,
                       "hbm_gib": self.system.hbm.capacity_gib,
                       "offload_gib": offload.capacity_gib if offload else 0,
                       "offload_gbps": offload.bandwidth_gbps if offload else None,
                       "offload_unbounded": self.offload_unbounded,
                       "nvlink_size": self.system.networks[0].size,
                       "hbm_headroom_gib": self.system.hbm_headroom_bytes / GiB},
            "overrides": dict(self.overrides), "gpus": self.gpus, "max_batch": self.max_batch,
            "datatype": self.datatype.value, "space": self.space, "attention": self.attention,
            "grad_datatype": self.grad_datatype, "capacity_factor": self.capacity_factor, **self.precision,
            "time_limit_s": self.time_limit_s, "fix": list(self.fix),
        }

    def payload(self, solver_workers: int = 1) -> dict:
        """Plain data for a worker process or a Dask task (rebuilt with model_validate)."""
        return {"id": self.id, "problem": self.to_dict(), "model": self.model.model_dump(mode="json"),
                "system": self.system.model_dump(mode="json"), "solver_workers": solver_workers}


# ---------------------------------------------------------------------- reading and expanding
def load_batch(path: str | Path, *, time_limit_s: float | None = None) -> list[Problem]:
    """Read a batch file and expand it into its problems, in file order, duplicates merged.
    `time_limit_s` (the command line's) replaces the file's. Errors are one-line InputErrors."""
    path = Path(path)
    data = read_document(path)
    kind = other_file_kind(data)
    if kind is not None:
        raise InputError(f"{path}: not a batch file (which lists models, systems and gpus, docs/batch-files.md) "
                         f"but {kind}")
    if isinstance(data, dict) and "name" not in data:
        data = {"name": path.stem, **data}
    batch = parse(BatchFile, data, str(path))
    top = batch.model_dump(exclude={"name", "description", "grids"}, exclude_none=True)
    grids = [_merge(top, g.model_dump(exclude_none=True)) for g in batch.grids] if batch.grids else [top]
    loader = _Loader(path)
    problems: dict[str, Problem] = {}
    for number, grid in enumerate(grids):
        where = f"{path}: grids.{number}" if batch.grids else str(path)
        for required in ("models", "systems", "gpus"):
            if required not in grid:
                raise InputError(f"{where}: missing field '{required}'")
        if "batch" in grid and "max_batch" in grid:
            raise InputError(f"{where}: 'batch' fixes the global batch and 'max_batch' caps it: give one")
    sizes = [grid_size(grid) for grid in grids]
    if sum(n for n, _ in sizes) > MAX_PROBLEMS:
        shown = "; ".join(text for _, text in sizes)
        raise InputError(f"{path}: the batch expands to {sum(n for n, _ in sizes):,} problems ({shown}), more than "
                         f"{MAX_PROBLEMS:,}: split it into several batch files")
    for number, grid in enumerate(grids):
        where = f"{path}: grids.{number}" if batch.grids else str(path)
        for problem in _expand(grid, loader, where, time_limit_s):
            known = problems.get(problem.id)
            if known is None:
                problems[problem.id] = problem
            elif known.payload() != problem.payload():
                raise InputError(f"{where}: two different problems get the id {problem.id!r}; give their models "
                                 f"or systems distinct names")
    if not problems:
        raise InputError(f"{path}: the batch expands to no problems")
    return list(problems.values())


def grid_size(grid: dict) -> tuple[int, str]:
    """How many problems a grid expands to (before duplicates merge), and the product spelled out."""
    axes = {name: len(grid.get(name, [None])) for name in ("models", "seq_size", "systems", "gpus", "max_batch",
                                                            "batch", "datatype", "space", "attention",
                                                            "grad_datatype", "capacity_factor", *PRECISION_DEFAULTS)}
    axes.update({name: len(values) for name, values in grid.get("overrides", {}).items()})
    total = 1
    for n in axes.values():
        total *= n
    return total, " × ".join(f"{name} {n}" for name, n in axes.items() if n > 1) or "1"


def _merge(top: dict, grid: dict) -> dict:
    merged = {**top, **grid}
    if "overrides" in top and "overrides" in grid:
        merged["overrides"] = {**top["overrides"], **grid["overrides"]}
    return merged


class _Loader:
    """Loads model and system files relative to the batch file, each once."""

    def __init__(self, batch_path: Path):
        self.base = batch_path.parent
        self.cache: dict[tuple[str, str, int | None], Model | System] = {}

    def get(self, kind: str, ref: str | dict, where: str, seq_size: int | None = None) -> tuple[Model | System, str]:
        if isinstance(ref, dict):
            cls = Model if kind == "models" else System
            if "name" not in ref:
                raise InputError(f"{where}: an inline entry of '{kind}' needs a name")
            if seq_size is not None and kind == "models":
                ref = {**ref, "seq_size": seq_size}
            return parse(cls, ref, f"{where}: {kind} {ref['name']!r}"), "inline"
        key = (kind, ref, seq_size)
        if key not in self.cache:
            target = self.base / ref
            try:
                self.cache[key] = load_model(target, seq_size=seq_size) if kind == "models" else load_system(target)
            except InputError as err:
                raise InputError(f"{where}: {kind}: {err}") from None
        return self.cache[key], ref


def _number(value: float) -> str:
    return f"{value:g}".replace("+", "")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def problem_id(model: Model, system_name: str, gpus: int, datatype: Datatype, max_batch: int, space: str,
               overrides: dict[str, Any], attention: str = "fused", fix: tuple[str, ...] = (),
               grad_datatype: str = "float32", capacity_factor: float = 1.0, precision: dict | None = None) -> str:
    """A readable id, e.g. gpt-1t-256b__h100-80g-nvl8__g4096__fp8__off1024g100; the max
    batch, space, attention kernel and gradient datatype appear only when they differ from
    the defaults."""
    system_tag = _slug(system_name)
    if "runtime_reserve_gib" in overrides:       # a property of the system: tagged on its name
        system_tag += f"-rr{_number(overrides['runtime_reserve_gib'])}"
    parts = [_slug(model.name), system_tag, f"g{gpus}", DATATYPE_TAGS[datatype.value]]
    parts.extend(_precision_tags(precision or {}))
    if max_batch != DEFAULT_MAX_BATCH:
        parts.append(f"b{max_batch}")
    if space != DEFAULT_SPACE:
        parts.append(_slug(space))
    if attention != "fused":
        parts.append(f"{attention}-attn")
    if grad_datatype != "float32":
        parts.append(f"{grad_datatype}-grads")
    if capacity_factor != 1.0:
        parts.append(f"cf{_number(capacity_factor)}")
    if fix:
        parts.append("fix-" + "-".join(_slug(pin.replace("=", "").replace(",", "+")) for pin in fix))
    if "hbm_gib" in overrides:
        parts.append(f"hbm{_number(overrides['hbm_gib'])}")
    if overrides.get("offload_gib") == 0:
        parts.append("nooff")
    elif "offload_gib" in overrides or "offload_gbps" in overrides:
        gbps = overrides.get("offload_gbps")
        gbps_tag = "" if gbps is None and "offload_gib" not in overrides else (
            "inf" if gbps in (None, UNBOUNDED) else _number(gbps))
        parts.append(f"off{_number(overrides['offload_gib']) if 'offload_gib' in overrides else ''}g{gbps_tag}")
    if "nvlink_size" in overrides:
        parts.append(f"nvl{overrides['nvlink_size']}")
    return "__".join(parts)


def _precision_tags(precision: dict) -> list[str]:
    """The id's precision part: the recipe (fp8-tensorwise), then its non-default options
    (bf16pg / lppg, bf16ends2, bf16-moments)."""
    tags = [precision["precision"]] if "precision" in precision else []
    if "low_precision_param_gather" in precision:
        tags.append("lppg" if precision["low_precision_param_gather"] else "bf16pg")
    if "bf16_first_last_blocks" in precision:
        tags.append(f"bf16ends{precision['bf16_first_last_blocks']}")
    if "optimizer_state" in precision:
        tags.append(f"{precision['optimizer_state']}-moments")
    return tags


def _precision_grid(grid: dict) -> list[dict]:
    """Every combination of a grid's precision settings, each as Kernels.precision_record states it."""
    names = [name for name in PRECISION_DEFAULTS if name in grid]
    return [Kernels(**dict(zip(names, values))).precision_record
            for values in itertools.product(*(grid[name] for name in names))]


def _expand(grid: dict, loader: _Loader, where: str, time_limit_s: float | None) -> list[Problem]:
    overrides = grid.get("overrides", {})
    knob_names = [k for k in ("hbm_gib", "offload_gib", "offload_gbps", "nvlink_size", "runtime_reserve_gib")
                  if k in overrides]
    limit = time_limit_s or grid.get("time_limit_s", DEFAULT_TIME_LIMIT_S)
    out = []
    fix = _pin_texts(grid.get("fix", {}), where)
    fixed_batch = "batch" in grid
    combos = itertools.product(grid["models"], grid.get("seq_size", [None]), grid["systems"], grid["gpus"],
                               grid.get("batch", grid.get("max_batch", [None])),
                               grid.get("datatype", [Datatype.bfloat16]), grid.get("space", [DEFAULT_SPACE]),
                               grid.get("attention", ["fused"]), grid.get("grad_datatype", ["float32"]),
                               grid.get("capacity_factor", [1.0]), _precision_grid(grid),
                               *(overrides[k] for k in knob_names))
    for (model_ref, seq_size, system_ref, gpus, max_batch, datatype, space, attention, grad_datatype,
         capacity_factor, precision, *knob_values) in combos:
        pins = (*fix, f"batch={max_batch}") if fixed_batch else fix
        model, _ = loader.get("models", model_ref, where, seq_size)
        if max_batch is None:            # no batch given: the default cap for this sequence length and space
            max_batch = default_batch_cap(model.seq_size, space)
        if seq_size is not None and len(grid["seq_size"]) > 1:
            model = model.model_copy(update={"name": f"{model.name}-s{seq_size}"})  # one id per sequence length
        base, source = loader.get("systems", system_ref, where)
        given = dict(zip(knob_names, knob_values))
        if given.get("offload_gib") == 0:
            given.pop("offload_gbps", None)  # no offload memory: its bandwidth means nothing
        datatype = Datatype(datatype)
        # the runtime reserve tags the id only when the grid varies it (one value is a setting)
        tagged = {k: v for k, v in given.items() if k != "runtime_reserve_gib" or len(overrides[k]) > 1}
        pid = problem_id(model, base.name, gpus, datatype, max_batch, space, tagged, attention, pins, grad_datatype,
                         capacity_factor, precision)
        system = _apply(base, given, f"{where}: {pid}")
        if grid.get("hbm_headroom") is not None:
            headroom = Headroom.parse(grid["hbm_headroom"], f"{where}: hbm_headroom")
            try:
                system = system.with_headroom(headroom)
            except InputError as err:
                raise InputError(f"{where}: {pid}: hbm_headroom {str(err).removeprefix('--hbm-headroom ')}") from None
            if system.hbm_headroom_bytes > 0:
                pid += f"__hr{_slug(headroom.text.replace('%', 'pct'))}"
        system.compute_for(datatype)
        if "precision" in precision:       # the GPU must run the recipe, in bfloat16
            Context.of(model, system, datatype, Kernels.with_attention(attention, grad_datatype, capacity_factor,
                                                                       **precision))
        unbounded = system.offload is not None and (given.get("offload_gbps") == UNBOUNDED or (
            base.offload is None and "offload_gbps" not in given))
        out.append(Problem(pid, model, system, base.name, source, given, gpus, max_batch, datatype, space, limit,
                           unbounded, attention, pins, grad_datatype, float(capacity_factor), precision))
    return out


def _pin_texts(fix: dict[str, Any], where: str) -> tuple[str, ...]:
    """A batch file's `fix` as --fix texts, checked now so a bad pin is an error before any solve."""
    texts = []
    for name, values in fix.items():
        values = values if isinstance(values, list) else [values]
        words = [("on" if v else "off") if isinstance(v, bool) else str(v) for v in values]
        texts.append(f"{name}={','.join(words)}")
    parse_pins(texts, option=f"{where}: fix")
    return tuple(texts)


def _apply(system: System, given: dict[str, Any], where: str) -> System:
    gbps = given.get("offload_gbps")
    if gbps == UNBOUNDED:
        gbps = system.hbm.bandwidth_gbps if system.offload is not None else None  # None: as fast as HBM
    try:
        return system.with_overrides(hbm_gib=given.get("hbm_gib"), offload_gib=given.get("offload_gib"),
                                     offload_gbps=gbps, nvlink_size=given.get("nvlink_size"),
                                     runtime_reserve_gib=given.get("runtime_reserve_gib"))
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    except ValidationError as err:
        raise InputError(describe_validation_error(err, System, where)) from None
