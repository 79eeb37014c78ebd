"""Batch results on disk: DIR/results.jsonl (one JSON object per problem, appended as each
finishes) and DIR/results.csv (a flat table written from it).

Crash safety: every line is written whole with one `write`, then flushed and fsync'ed, so
a finished result survives even `kill -9` of the batch. A process killed in the middle of a
write can leave one partial line at the end of the file; `ResultStore.open` detects it (no
trailing newline, or not valid JSON), cuts it off and the batch solves that problem again.
Unreadable lines elsewhere (a hand edit) are dropped the same way, with a warning. A lock
file keeps two batch runs from writing the same directory at once.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from costmodel.space.dimensions import DIMENSIONS
from costmodel.errors import InputError
from costmodel.inputs.units import GiB
from solver.report.documents import gpu_hours_per_million_tokens, tokens_per_s_per_gpu

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"
LOCK_FILE = ".mapsat-batch.lock"


@dataclass
class ResultStore:
    """The results of one batch directory. Use `ResultStore.open(dir)`, then `append`,
    then `close` (or `with`)."""

    directory: Path
    records: dict[str, dict] = field(default_factory=dict)
    """Finished records by id, in file order."""
    warnings: list[str] = field(default_factory=list)
    """What `open` repaired (dropped partial or unreadable lines, duplicate ids)."""
    _lock_fd: int | None = None

    @property
    def jsonl_path(self) -> Path:
        return self.directory / RESULTS_JSONL

    @property
    def csv_path(self) -> Path:
        return self.directory / RESULTS_CSV

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, directory: str | Path, *, lock: bool = True) -> "ResultStore":
        """Create the directory if needed, take the lock, read and repair results.jsonl."""
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError(f"--out {directory}: cannot create the directory ({err.strerror})") from None
        if not directory.is_dir():
            raise InputError(f"--out {directory}: is not a directory")
        store = cls(directory)
        if lock:
            store._lock()
        try:
            store._load()
        except BaseException:
            store.close()
            raise
        return store

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, as before
            return
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise InputError(f"--out {self.directory}: another `mapsat batch` is writing there (lock "
                             f"{LOCK_FILE} is held); wait for it or choose another directory") from None
        self._lock_fd = fd

    def _load(self) -> None:
        path = self.jsonl_path
        if not path.exists():
            return
        data = path.read_bytes()
        kept: list[bytes] = []
        changed = False
        lines = data.split(b"\n")
        tail = lines.pop()  # after the last newline: b"" when the file ends with a newline
        if tail:
            self.warnings.append(f"{path}: dropped a partial last line ({len(tail)} bytes, an interrupted "
                                 f"write); that problem will be solved again")
            changed = True
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                changed = True
                continue
            record = _parse_line(line)
            if record is None:
                self.warnings.append(f"{path}: line {number} is not a result record; dropped")
                changed = True
                continue
            if record["id"] in self.records:
                self.warnings.append(f"{path}: line {number} repeats id {record['id']!r}; kept the first")
                changed = True
                continue
            self.records[record["id"]] = record
            kept.append(line)
        if changed:
            if not tail or len(kept) != len(lines):
                self._rewrite(kept)
            else:  # only a partial tail: cut it off in place
                with open(path, "r+b") as handle:
                    handle.truncate(len(data) - len(tail))
                    handle.flush()
                    os.fsync(handle.fileno())

    def _rewrite(self, lines: list[bytes]) -> None:
        """Replace results.jsonl atomically (write a temporary file, fsync, rename)."""
        temporary = self.jsonl_path.with_suffix(".jsonl.tmp")
        with open(temporary, "wb") as handle:
            handle.write(b"".join(line + b"\n" for line in lines))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.jsonl_path)

    # ------------------------------------------------------------------ using
    def finished_ids(self) -> set[str]:
        return set(self.records)

    def drop(self, ids: Iterable[str]) -> int:
        """Forget the records of `ids` (e.g. errors to retry); rewrites the file. Returns how many."""
        ids = [i for i in ids if i in self.records]
        if not ids:
            return 0
        for i in ids:
            del self.records[i]
        self._rewrite([json.dumps(r, sort_keys=True).encode() for r in self.records.values()])
        return len(ids)

    def append(self, record: dict) -> None:
        """Write one record as one line, flushed and fsync'ed before returning."""
        if "id" not in record:
            raise ValueError("a result record needs an id")
        if record["id"] in self.records:
            return  # already there: never duplicate
        line = (json.dumps(_finite(record), sort_keys=True, allow_nan=False) + "\n").encode()
        fd = os.open(self.jsonl_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = 0
            while written < len(line):
                written += os.write(fd, line[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records[record["id"]] = record

    def write_csv(self, order: list[str] | None = None) -> Path:
        """Write results.csv (atomically): rows in `order` (ids; the batch file's order),
        then any other records in file order."""
        order = order or []
        ids = [i for i in order if i in self.records]
        seen = set(ids)
        ids += [i for i in self.records if i not in seen]
        rows = [csv_row(self.records[i]) for i in ids]
        temporary = self.csv_path.with_suffix(".csv.tmp")
        with open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, self.csv_path)
        return self.csv_path

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _finite(value):
    """Strict JSON: non-finite floats (inf, nan) become null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def _parse_line(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str) or "status" not in record:
        return None
    return record


RECORD_NUMBER_MAX = 2.0**53
"""Numbers in a record stay below 2^53 (exact in a float): GPU counts, parameters and times do."""
_NUMBER, _WHOLE, _SIZE, _TEXT, _FLAG = "positive number", "positive whole number", "number >= 0", "text", "true/false"
_RECORD_FIELDS = {   # what plots and tables read from a record, and the kind each must be
    ("problem", "gpus"): _WHOLE, ("problem", "max_batch"): _WHOLE, ("problem", "datatype"): _TEXT,
    ("problem", "space"): _TEXT, ("problem", "attention"): _TEXT, ("problem", "grad_datatype"): _TEXT,
    ("problem", "model", "params"): _NUMBER,
    ("problem", "model", "name"): _TEXT, ("problem", "system", "name"): _TEXT,
    ("problem", "system", "hbm_gib"): _NUMBER, ("problem", "system", "offload_gib"): _SIZE,
    ("problem", "system", "offload_gbps"): _NUMBER, ("problem", "system", "offload_unbounded"): _FLAG,
    ("problem", "system", "nvlink_size"): _WHOLE, ("best", "mfu"): _SIZE, ("best", "iteration_time_s"): _NUMBER,
}


def _is(value, kind: str, positive: bool) -> bool:
    if kind == _TEXT:
        return isinstance(value, str)
    if kind == _FLAG:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if abs(value) > RECORD_NUMBER_MAX:
        return False
    if kind == _SIZE and positive:
        return value >= 0
    return (value > 0 or not positive) and (kind != _WHOLE or isinstance(value, int))


def record_problem(record: dict) -> str | None:
    """Why a parsed record is not one `mapsat batch` could have written (a field of the wrong
    kind where plots and tables read it), or None. Sizes must be positive in a solved record
    (plots put them on log axes); an error record may carry any number its input held."""
    solved = isinstance(record.get("best"), dict)
    for path, kind in _RECORD_FIELDS.items():
        value: object = record
        for depth, key in enumerate(path):
            if value is None:
                break
            if not isinstance(value, dict):
                return f"'{'.'.join(path[:depth])}' is not a mapping"
            value = value.get(key)
        if value is not None and not _is(value, kind, solved):
            return f"'{'.'.join(path)}' {value!r} is not a {kind}"
    return None


def read_results(directory: str | Path, dropped: list[int] | None = None) -> list[dict]:
    """The complete records of a batch directory (partial lines ignored), read-only: for
    plots and reports while a batch may still be running. The numbers of complete lines
    that are not result records are appended to `dropped` when it is given; a file whose
    every line is such is an InputError naming it."""
    path = Path(directory) / RESULTS_JSONL
    if not Path(directory).is_dir():
        raise InputError(f"{directory}: no such directory")
    if not path.exists():
        raise InputError(f"{directory}: has no {RESULTS_JSONL} (run `mapsat batch FILE --out {directory}` first)")
    records: dict[str, dict] = {}
    bad: list[int] = []
    for number, line in enumerate(path.read_bytes().split(b"\n")[:-1], start=1):
        record = _parse_line(line) if line.strip() else None
        if record is not None and record_problem(record) is not None:
            record = None
        if record is None and line.strip():
            bad.append(number)
        elif record is not None and record["id"] not in records:
            records[record["id"]] = record
    if bad and not records:
        shown = ", ".join(map(str, bad[:5])) + (", …" if len(bad) > 5 else "")
        raise InputError(f"{path}: none of its lines is a result record ({len(bad)} line(s) are not: {shown})")
    if dropped is not None:
        dropped.extend(bad)
    return list(records.values())


# ---------------------------------------------------------------------- the CSV table
CSV_COLUMNS = [
    "id", "status", "model", "params", "num_blocks", "hidden", "attn_heads", "seq_size",
    "system", "gpus", "datatype", "precision", "space", "attention", "grad_datatype", "max_batch", "hbm_gib",
    "offload_gib",
    "offload_gbps", "nvlink_size",
    "mappings", "iteration_time_s", "tokens_per_s_per_gpu", "gpu_hours_per_1m_tokens", "mfu", "hfu", *(dim.name for dim in DIMENSIONS),
    "hbm_used_gib", "offload_used_gib", "certified_optimal", "gap", "seconds", "error",
]


def csv_row(record: dict) -> dict:
    """One flat row of a result record (empty cells where there is nothing)."""
    problem = record.get("problem") or {}
    model = problem.get("model") or {}
    system = problem.get("system") or {}
    best = record.get("best") or {}
    mapping = best.get("mapping") or {}
    memory = best.get("memory") or {}
    row = {
        "id": record["id"], "status": record.get("status"),
        "model": model.get("name"), "params": model.get("params"), "num_blocks": model.get("num_blocks"),
        "hidden": model.get("hidden"), "attn_heads": model.get("attn_heads"), "seq_size": model.get("seq_size"),
        "system": system.get("name"), "gpus": problem.get("gpus"), "datatype": problem.get("datatype"),
        "precision": problem.get("precision"),
        "space": problem.get("space"), "attention": problem.get("attention", "fused"),
        "grad_datatype": problem.get("grad_datatype", "float32"),
        "max_batch": problem.get("max_batch"),
        "hbm_gib": system.get("hbm_gib"), "offload_gib": system.get("offload_gib"),
        "offload_gbps": system.get("offload_gbps"), "nvlink_size": system.get("nvlink_size"),
        "mappings": record.get("mappings"),
        "iteration_time_s": best.get("iteration_time_s"), "tokens_per_s_per_gpu": tokens_per_s_per_gpu(record),
        "gpu_hours_per_1m_tokens": gpu_hours_per_million_tokens(record), "mfu": best.get("mfu"), "hfu": best.get("hfu"),
        **{dim.name: mapping.get(dim.field) for dim in DIMENSIONS},
        "hbm_used_gib": memory["hbm_bytes"] / GiB if "hbm_bytes" in memory else None,
        "offload_used_gib": memory["offload_bytes"] / GiB if "offload_bytes" in memory else None,
        "certified_optimal": record.get("certified_optimal"), "gap": record.get("gap"),
        "seconds": record.get("seconds"), "error": record.get("error"),
    }
    return {key: "" if value is None else value for key, value in row.items()}
