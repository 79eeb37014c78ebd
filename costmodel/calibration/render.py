"""Writing fitted fields into a system file: `mapsat calibrate`'s library side.

The base file is a system file whose calibrated fields are replaced by marker comments, one
per family, at the indentation where the fields belong:

    # mapsat-calibrate: gemm fp8        (inside compute.float8; `gemm bf16` inside bfloat16)
    # mapsat-calibrate: grouped_gemm bf16  (inside compute.bfloat16: mixture-of-experts grouped GEMMs;
                                         from grouped_gemm.json, or from a forward + backward table,
                                         grouped_gemm_fwd_bwd.json, the `gemm` fit's efficiency refitted)
    # mapsat-calibrate: attention       (inside a compute entry; fitted to bf16 attention.json)
    # mapsat-calibrate: hbm             (inside hbm: efficiency and latency_us)
    # mapsat-calibrate: network NAME    (inside that network: efficiency and latency_us, from nccl-tests)
    # mapsat-calibrate: step            (top level: the whole-step terms; `calibrate --runs` writes them,
                                         costmodel.calibration.step_render, and this copies them through)

Below each marker go the fitted fields with a comment stating the measurements, the split
and the errors; every other line of the base is copied as it is (comments included). The
markers stay in the result, so a calibrated file is also a base: calibrating it again
replaces the fields a previous run wrote (an update in place). The result is a pure function
of the base text and the measurements, so a test can regenerate a shipped file and compare it
byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from costmodel.calibration import fit as fitting
from costmodel.calibration.measurements import (gemm_split, load_adam, load_attention, load_eltwise, load_gemm,
                                                load_grouped_gemm, load_grouped_gemm_passes, load_nccl)
from costmodel.errors import InputError
from costmodel.inputs.load import parse, read_document
from costmodel.inputs.system import Clocks, Datatype, System
from costmodel.inputs.units import gbps_to_bytes_per_s, tflops_to_flops_per_s

MARKER = re.compile(r"^(?P<indent>\s*)# mapsat-calibrate:\s*(?P<what>.*?)\s*$")
GEMM_DATATYPES = {"fp8": ("float8", 1.0), "bf16": ("bfloat16", 2.0)}
# Fused AdamW reads parameter, gradient and both moments and writes parameter and moments:
# 7 fp32 values = 28 bytes per parameter (the measuring script's count).
ADAM_BYTES_PER_PARAM = 28.0
# What a run writes below each marker: the fields (keys at the marker's indentation) and the
# comment lines that open the block (_comment).
GENERATED_KEYS = {"gemm": ("gemm",), "grouped_gemm": ("grouped_gemm",), "attention": ("attention",),
                  "hbm": ("efficiency", "latency_us"), "network": ("efficiency", "latency_us")}
GENERATED_COMMENTS = ("# Fitted by `mapsat calibrate`", "# |error| of time", "# Held out,")


@dataclass(frozen=True)
class Calibration:
    text: str                          # the calibrated system file
    fits: list[fitting.FamilyFit]      # every family fitted or tested, in marker order
    notes: list[str]                   # measured facts the file does not hold (host link)


def _number(value: float) -> str:
    """A YAML 1.1 float PyYAML reads back as a number: a signed exponent and a decimal point."""
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    text = f"{value:.{fitting.SIGNIFICANT_DIGITS}g}"
    mantissa, _, exponent = text.partition("e")
    if exponent and "." not in mantissa:
        mantissa += ".0"
    return mantissa + (f"e{exponent}" if exponent else "")


def _comment(indent: str, family: fitting.FamilyFit, source: str) -> list[str]:
    lines = [f"{indent}# Fitted by `mapsat calibrate` to {source}, {family.fit_points}.",
             f"{indent}# |error| of time where fitted: {family.fit.text()}."]
    if family.test.count:
        lines.append(f"{indent}# Held out, {family.test_points}: {family.test.text()}.")
    return lines


def _fields(indent: str, fields: dict) -> list[str]:
    return [f"{indent}{name}: {_number(value)}" for name, value in fields.items()]


def _base_doc(base_path: Path) -> dict:
    doc = read_document(base_path)
    if not isinstance(doc, dict):
        raise InputError(f"{base_path}: expected a system file (a mapping of fields)")
    return doc


def _get(doc: dict, path: tuple, base_path: Path):
    value = doc
    for part in path:
        if not isinstance(value, dict) or part not in value:
            raise InputError(f"{base_path}: field '{'.'.join(path)}' is needed to calibrate and is missing")
        value = value[part]
    return value


def _network_bandwidth(doc: dict, name: str, base_path: Path) -> float:
    for net in _get(doc, ("networks",), base_path):
        if isinstance(net, dict) and net.get("name") == name:
            return float(net["bandwidth_gbps"])
    raise InputError(f"{base_path}: marker 'network {name}' names no network of that name")


def calibrate_system(base_path: Path, measurements: Path, nccl: dict[str, Path] | None = None) -> Calibration:
    """The base system file with every marker replaced by fields fitted to the measurements in
    the folder `measurements` (gemm.json, grouped_gemm.json or grouped_gemm_fwd_bwd.json, attention.json, eltwise.json,
    adam.json, host.json)
    and to nccl-tests output per network name."""
    base_path, measurements, nccl = Path(base_path), Path(measurements), dict(nccl or {})
    doc = _base_doc(base_path)
    text = base_path.read_text(encoding="utf-8")
    hbm_bytes_per_s = gbps_to_bytes_per_s(float(_get(doc, ("hbm", "bandwidth_gbps"), base_path)))
    folder = measurements.name
    out, fits, notes, used_nccl = [], [], [], set()
    gemm_fits: dict[str, dict] = {}          # the GEMM fields written above, by datatype
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line, number = lines[index], index + 1
        index += 1
        match = MARKER.match(line)
        if not match:
            out.append(line)
            continue
        indent, what = match["indent"], match["what"].split()
        # The marker stays, so the written file can be calibrated again (updated in place);
        # what a previous run wrote below it is dropped and written anew.
        out.append(line)
        if what == ["step"]:
            continue      # whole-step terms: `mapsat calibrate --runs` writes them; copied as they are
        index = _after_generated(lines, index, indent, GENERATED_KEYS.get(what[0] if what else "", ()))
        if len(what) == 2 and what[0] == "gemm" and what[1] in GEMM_DATATYPES:
            datatype, elem_bytes = GEMM_DATATYPES[what[1]]
            peak = tflops_to_flops_per_s(float(_get(doc, ("compute", datatype, "matrix_tflops"), base_path)))
            path = measurements / "gemm.json"
            split = gemm_split(path, what[1])
            f = fitting.fit_gemm(load_gemm(path, what[1], split[0]), load_gemm(path, what[1], split[1]), peak,
                                 hbm_bytes_per_s, elem_bytes, what[1], split,
                                 _full_clock(doc, measurements, base_path, Datatype(datatype)))
            out += _comment(indent, f, f"{folder}/gemm.json ({what[1]})") + [f"{indent}gemm:"]
            out += _fields(indent + "  ", f.fields)
            gemm_fits[what[1]] = f.fields
        elif len(what) == 2 and what[0] == "grouped_gemm" and what[1] in GEMM_DATATYPES:
            f, source = _grouped_gemm_fit(doc, base_path, measurements, what[1], gemm_fits.get(what[1]))
            out += _comment(indent, f, f"{folder}/{source} ({what[1]})") + [f"{indent}grouped_gemm:"]
            out += _fields(indent + "  ", f.fields)
        elif what == ["attention"]:
            f = fitting.fit_attention(load_attention(measurements / "attention.json"))
            out += _comment(indent, f, f"{folder}/attention.json") + [f"{indent}attention:"]
            out += _fields(indent + "  ", f.fields)
        elif what == ["hbm"]:
            f = fitting.fit_hbm(load_eltwise(measurements / "eltwise.json"), hbm_bytes_per_s)
            out += _comment(indent, f, f"{folder}/eltwise.json")
            out += [f"{indent}efficiency:", f"{indent}  - [0, {_number(f.fields['efficiency'])}]",
                    f"{indent}latency_us: {_number(f.fields['latency_us'])}"]
            fits.append(f)
            f = _adam_check(f.fields, measurements, hbm_bytes_per_s)
        elif len(what) == 2 and what[0] == "network":
            if what[1] not in nccl:
                raise InputError(f"{base_path}: line {number} asks for network {what[1]!r}; give its nccl-tests "
                                 f"output with --nccl {what[1]}=FILE")
            used_nccl.add(what[1])
            f = fitting.fit_network(load_nccl(nccl[what[1]]), _network_bandwidth(doc, what[1], base_path), what[1])
            out += _comment(indent, f, f"nccl-tests output {Path(nccl[what[1]]).name}")
            out += _fields(indent, f.fields)
        else:
            raise InputError(f"{base_path}: line {number}: unknown marker {match['what']!r} (expected 'gemm fp8', "
                             "'gemm bf16', 'grouped_gemm bf16', 'grouped_gemm fp8', 'attention', 'hbm', "
                             "'network NAME' or 'step')")
        fits.append(f)
    unused = sorted(set(nccl) - used_nccl)
    if unused:
        raise InputError(f"--nccl {unused[0]}: {base_path} has no '# mapsat-calibrate: network {unused[0]}' marker")
    if not fits:
        raise InputError(f"{base_path}: no '# mapsat-calibrate: ...' marker; nothing to calibrate")
    if (measurements / "host.json").exists():
        notes.append(_host_note(measurements / "host.json"))
    result = "\n".join(out) + ("\n" if text.endswith("\n") else "")
    parse(System, yaml.safe_load(result), f"{base_path} once calibrated")
    return Calibration(result, fits, notes)


class TableSource(BaseModel):
    """A measurement folder's `source.json`: where a published table comes from and how it was
    timed (problems/measurements/README.md). Without one, a folder is this project's
    microbenchmark (benchmarks/measure_gpu.py: host-timed, long enough to see the power limit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    gpu: str
    source: str
    at_full_clock: bool = Field(description="Short runs at full clock: the sustained clock's drop is not in the times.")
    launch_overhead_us: float = Field(ge=0, description="Host-side launch time the table's device timing leaves out.")
    launch_overhead_source: str


def _grouped_gemm_fit(doc: dict, base_path: Path, measurements: Path, dtype: str,
                      gemm: dict | None) -> tuple[fitting.FamilyFit, str]:
    """The grouped GEMMs of `dtype`: the GEMM formula's seven fields fitted anew to grouped_gemm.json
    (single GEMMs by shape), or else, from grouped_gemm_fwd_bwd.json (a table of forward + backward
    times, too few shapes for seven fields), the `gemm` fit written above it with its efficiency
    refitted; and the file it read."""
    datatype, elem_bytes = GEMM_DATATYPES[dtype]
    peak = tflops_to_flops_per_s(float(_get(doc, ("compute", datatype, "matrix_tflops"), base_path)))
    hbm_bytes_per_s = gbps_to_bytes_per_s(float(_get(doc, ("hbm", "bandwidth_gbps"), base_path)))
    if (measurements / "grouped_gemm.json").exists() or not (measurements / "grouped_gemm_fwd_bwd.json").exists():
        data = load_grouped_gemm(measurements / "grouped_gemm.json", dtype)
        return fitting.fit_grouped_gemm(data, peak, hbm_bytes_per_s, elem_bytes, dtype), "grouped_gemm.json"
    if gemm is None:
        raise InputError(f"{base_path}: marker 'grouped_gemm {dtype}' with {measurements.name}/grouped_gemm_fwd_bwd.json "
                         f"refits the GEMM fit's efficiency: put it below a 'gemm {dtype}' marker")
    efficiency = _get(doc, ("hbm", "efficiency"), base_path)
    last = efficiency[-1] if isinstance(efficiency, list) and efficiency else None
    if not (isinstance(last, list) and len(last) == 2 and isinstance(last[1], (int, float))):
        raise InputError(f"{base_path}: hbm.efficiency: the loss passes of grouped_gemm_fwd_bwd.json need it as "
                         "[[bytes, efficiency], ...] in the base file")
    loss_bytes_per_s = hbm_bytes_per_s * float(last[1])      # passes of GBs: the largest class
    data = load_grouped_gemm_passes(measurements / "grouped_gemm_fwd_bwd.json", dtype)
    return (fitting.fit_grouped_gemm_efficiency(gemm, data, peak, hbm_bytes_per_s, elem_bytes, loss_bytes_per_s, dtype),
            "grouped_gemm_fwd_bwd.json")


def _full_clock(doc: dict, measurements: Path, base_path: Path, datatype: Datatype) -> fitting.FullClock | None:
    """How a table timed at full clock is fitted: the drop of the base file's sustained clock
    for `datatype` and the table's launch overhead; None for a microbenchmark folder."""
    path = measurements / "source.json"
    if not path.exists():
        return None
    table = parse(TableSource, read_document(path), str(path))
    if not table.at_full_clock:
        return None
    clocks = parse(Clocks, _get(doc, ("clocks",), base_path), f"{base_path}: clocks")
    return fitting.FullClock(clocks.drop(datatype), table.launch_overhead_us)


def _after_generated(lines: list[str], start: int, indent: str, keys: tuple[str, ...]) -> int:
    """The index of the first line after the block a previous run wrote below a marker at
    `indent`: its comment lines, then the family's keys at that indentation with the deeper
    lines below each (a map's fields, a curve's pairs)."""
    index = start
    while index < len(lines):
        line = lines[index]
        if line.startswith(tuple(indent + c for c in GENERATED_COMMENTS)):
            index += 1
            continue
        at_indent = line.startswith(indent) and not line[len(indent):].startswith((" ", "#"))
        if at_indent and line[len(indent):].split(":")[0] in keys:
            index += 1
            while index < len(lines) and lines[index].startswith(indent + " ") and lines[index].strip():
                index += 1
            continue
        return index
    return index


def _adam_check(hbm_fields: dict, measurements: Path, hbm_bytes_per_s: float) -> fitting.FamilyFit:
    """The HBM fit tested on a family it never saw: fused AdamW steps (adam.json)."""
    params, time_s = load_adam(measurements / "adam.json")
    modelled = fitting.hbm_predict(hbm_fields, ADAM_BYTES_PER_PARAM * params, hbm_bytes_per_s)
    return fitting.FamilyFit("fused Adam (HBM fit)", {}, fitting.Errors.of(np.array([]), np.array([])),
                             fitting.Errors.of(modelled, time_s), "none", "adam.json, 28 bytes per parameter")


def _host_note(path: Path) -> str:
    rows = read_document(path)
    try:
        largest = max(rows, key=lambda r: r["mib"])
        return (f"host link ({path.parent.name}/host.json, {largest['mib']} MiB pinned copies): "
                f"{largest['h2d_gbps']:.0f} GB/s host→GPU, {largest['d2h_gbps']:.0f} GB/s GPU→host alone, "
                f"{largest['bidir_each_gbps']:.0f} GB/s each with both at once — a CPU-hosted offload tier's "
                "--offload-gbps")
    except (TypeError, KeyError, ValueError):
        raise InputError(f"{path}: expected points with mib, h2d_gbps, d2h_gbps, bidir_each_gbps") from None
