"""Fuzzing every command (issue 17): input files and options drawn from valid values and
hostile ones (huge, tiny, negative, NaN, booleans, text, wrong shapes), each run through the
real command group. Whatever comes in, a command answers (exit 0), or gives one line
`error: ...` (exit 1) or a click usage error (exit 2): never a traceback, never a hang (each
example runs under an alarm), never unbounded memory (the address space is capped while
the examples run).

Valid problems are kept tiny (a few GPUs, a narrow model) so that FUZZ_EXAMPLES examples of
each command run in seconds: the point is the boundary, not the search. The default run
draws FUZZ_EXAMPLES_DEFAULT examples per command; the slow run (`python -m pytest -m slow`)
the full FUZZ_EXAMPLES."""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import sys
import traceback
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import A100_SYSTEM, SYSTEM_DATA, examples
from solver.cli import batch as batch_command
from solver.cli.app import cli
from solver.report.plots import KINDS
from solver.study.runner import BatchSummary

FUZZ_EXAMPLES = int(__import__("os").environ.get("FUZZ_EXAMPLES", 500))
"""Examples per command in the slow run (the issue asks for at least 500 in CI)."""
FUZZ_EXAMPLES_DEFAULT = 50
"""Examples per command in the default run: every command still meets hostile values."""
EXAMPLE_TIMEOUT_S = 20
"""An example still running after this long is a hang."""
MEMORY_HEADROOM_BYTES = 3 << 30
"""Address space an example may add to what the test process already maps."""


def fuzz(examples: int) -> settings:
    """The settings of every fuzz test: `examples` examples, the same ones every run."""
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


HOSTILE_INTS = st.sampled_from([0, -1, -(2**63), 2**31, 2**40, 2**62, 2**63 - 1, 2**63, 2**64, 10**30, 7, 5000])
HOSTILE_FLOATS = st.sampled_from([0.0, -0.0, -1.0, 1e-300, 1e-12, 5e-324, 1e300, 1e308, float("nan"), float("inf"),
                                  -float("inf"), 0.5, 1.5, 12.5])
HOSTILE = st.one_of(HOSTILE_INTS, HOSTILE_FLOATS, st.booleans(), st.none(), st.text(max_size=4),
                    st.lists(st.integers(-3, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


HOSTILE_ONE_IN = 16
"""Each value is hostile with probability 1/16: about half the examples carry one or more
hostile values (errors at the boundary), the rest are valid problems (answers)."""


def maybe(valid: st.SearchStrategy, hostile: st.SearchStrategy = HOSTILE) -> st.SearchStrategy:
    """Mostly a valid value, sometimes a hostile one."""
    return st.integers(1, HOSTILE_ONE_IN).flatmap(lambda i: hostile if i == 1 else valid)


@st.composite
def models(draw) -> dict:
    return {"name": "fuzz", "hidden": draw(maybe(st.sampled_from([32, 64, 96]))),
            "feedforward": draw(maybe(st.sampled_from([128, 256]))), "seq_size": draw(maybe(st.sampled_from([32, 64]))),
            "attn_heads": draw(maybe(st.sampled_from([1, 2, 4, 7]))), "attn_size": draw(maybe(st.sampled_from([8, 16]))),
            "num_blocks": draw(maybe(st.sampled_from([1, 2, 3, 4]))),
            "vocab_size": draw(maybe(st.sampled_from([64, 1000])))}


SYSTEM_LEAVES = [("hbm", "capacity_gib"), ("hbm", "bandwidth_gbps"), ("hbm", "efficiency"),
                 ("compute", "bfloat16", "matrix_tflops"), ("compute", "bfloat16", "vector_tflops"),
                 ("compute", "bfloat16", "matrix_efficiency"), ("networks", 0, "size"), ("networks", 1, "size"),
                 ("networks", 0, "bandwidth_gbps"), ("networks", 1, "efficiency"), ("networks", 0, "latency_us"),
                 ("networks", 1, "processor_usage"), ("networks", 0, "collectives"), ("offload",), ("networks",)]
COLLECTIVES = st.fixed_dictionaries({op: st.fixed_dictionaries({"bytes_factor": maybe(st.just(1.0)),
                                                                 "n_offset": maybe(st.sampled_from([0.0, -1.0, -2.0, -5.0]))})
                                     for op in ("p2p", "all_reduce", "reduce_scatter", "all_gather")})


@st.composite
def systems(draw, base: dict = SYSTEM_DATA) -> dict:
    data = json.loads(json.dumps(base))
    for path in draw(st.lists(st.sampled_from(SYSTEM_LEAVES), max_size=2, unique=True)):
        holder = data
        try:
            for key in path[:-1]:
                holder = holder[key]
        except (KeyError, IndexError, TypeError):
            continue  # not in this system, or an earlier change replaced what held it
        if not isinstance(holder, (dict, list)) or isinstance(holder, list) and path[-1] >= len(holder):
            continue
        if path[-1] == "collectives":
            holder["collectives"] = draw(COLLECTIVES)
        elif path[-1] == "offload":
            holder["offload"] = {"capacity_gib": draw(maybe(st.just(64.0))), "bandwidth_gbps": draw(maybe(st.just(50.0)))}
        elif path[-1] in ("efficiency", "matrix_efficiency") and path[0] != "networks":
            curves = st.lists(st.tuples(maybe(st.just(0.0)), maybe(st.just(0.5))), max_size=3)
            holder[path[-1]] = draw(maybe(st.sampled_from([[[0, 1.0]], [[0, 0.5], [1e6, 0.9]]]), curves))
        else:
            holder[path[-1]] = draw(maybe(st.just(holder[path[-1]])))
    return data


def option(name: str, valid: st.SearchStrategy) -> st.SearchStrategy:
    """[] (left out), [name, value], or [name, hostile value]; values as the shell passes them."""
    return st.one_of(st.just([]), maybe(valid).map(lambda v: [name, str(v)]))


OVERRIDES = st.tuples(option("--hbm-gib", st.just(120.0)), option("--offload-gib", st.sampled_from([0.0, 64.0])),
                      option("--offload-gbps", st.just(100.0)), option("--nvlink-size", st.just(4)))
SPACE = st.tuples(maybe(st.sampled_from([1, 2, 4])).map(lambda g: ["--gpus", str(g)]),
                  option("--max-batch", st.sampled_from([4, 16])), option("--space", st.just("calculon-2023")),
                  option("--fix", st.sampled_from(["tp=2", "recompute=full,none", "weight_offload=on", "dp_net=1"])),
                  option("--batch", st.sampled_from([4, 8])), option("--attention", st.just("unfused")),
                  option("--grad-datatype", st.sampled_from(["float32", "16bit"])))


def flat(parts) -> list[str]:
    return [word for part in parts for word in part]


@contextlib.contextmanager
def bounded(seconds: float = EXAMPLE_TIMEOUT_S):
    """Raise in the example when it runs past `seconds` (a hang), with the address space capped."""
    def hang(signum, frame):
        raise TimeoutError(f"example still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def memory_cap():
    """Cap the address space at what the process maps now plus MEMORY_HEADROOM_BYTES."""
    if not sys.platform.startswith("linux"):
        yield
        return
    mapped = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + MEMORY_HEADROOM_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def write(directory: Path, name: str, content) -> str:
    path = directory / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    return str(path)


def run(*args: str):
    with bounded():
        result = CliRunner().invoke(cli, list(args), prog_name="mapsat")
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    where = "".join(traceback.format_exception(result.exception)) if crashed else ""
    assert not crashed, f"mapsat {' '.join(args)}\n{where}"
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code == 1:
        lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    if result.exit_code == 2:
        assert sum(line.startswith("Error: ") for line in result.output.splitlines()) == 1, (args, result.output)
    return result


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_count(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(model=models(), system=systems(), space=SPACE, overrides=OVERRIDES)
    def check(model, system, space, overrides):
        run("count", "--model", write(workdir, "m.yaml", model), "--system", write(workdir, "s.yaml", system),
            *flat(space), *flat(overrides), "--json", "--quiet")

    check()


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_solve(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(model=models(), system=systems(), space=SPACE, overrides=OVERRIDES,
           search=st.tuples(option("--time-limit", st.just(0.05)), option("--workers", st.just(1)),
                            option("--seed", st.just(3)), option("--top-k", st.just(2))))
    def check(model, system, space, overrides, search):
        time_limit = [] if search[0] else ["--time-limit", "0.05"]
        run("solve", "--model", write(workdir, "m.yaml", model), "--system", write(workdir, "s.yaml", system),
            *flat(space), *flat(overrides), *flat(search), *time_limit, "--json", "--quiet")

    check()


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_explain(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(model=models(), system=systems(), space=SPACE, overrides=OVERRIDES,
           dims=option("--dims", st.sampled_from(["tp,recompute", "microbatch", "pp,dp_net"])))
    def check(model, system, space, overrides, dims):
        run("explain", "--model", write(workdir, "m.yaml", model), "--system", write(workdir, "s.yaml", system),
            *flat(space), *flat(overrides), *dims, "--time-limit", "0.05", "--json", "--quiet")

    check()


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_brute(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(model=models(), system=systems(), gpus=maybe(st.sampled_from([1, 2])), overrides=OVERRIDES,
           top_k=option("--top-k", st.just(3)))
    def check(model, system, gpus, overrides, top_k):
        run("brute", "--model", write(workdir, "m.yaml", model), "--system", write(workdir, "s.yaml", system),
            "--gpus", str(gpus), "--max-batch", "4", "--workers", "1", *flat(overrides), *top_k, "--json", "--quiet")

    check()


MAPPING = {"num_procs": 2, "tensor_par": 1, "pipeline_par": 1, "data_par": 2, "tensor_par_net": 0,
           "pipeline_par_net": 0, "data_par_net": 0, "batch_size": 4, "microbatch_size": 1}


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_eval(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(model=models(), system=systems(),
           mapping=st.fixed_dictionaries({key: maybe(st.just(value)) for key, value in MAPPING.items()}))
    def check(model, system, mapping):
        run("eval", "--model", write(workdir, "m.yaml", model), "--system", write(workdir, "s.yaml", system),
            "--mapping", write(workdir, "p.json", json.dumps(mapping)), "--json", "--quiet")

    check()


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_validate(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(system=systems(yaml.safe_load(A100_SYSTEM.read_text())))
    def check(system):
        run("validate", "--system", write(workdir, "s.yaml", system), "--json")

    check()


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_shape(memory_cap, examples):
    @fuzz(examples)
    @given(params=maybe(st.sampled_from(["1e11", "1.1e12"]), HOSTILE_FLOATS),
           options=st.tuples(option("--blocks", st.sampled_from(["2,4", "254,256"])), option("--heads", st.just(8)),
                             option("--seq-size", st.just(64)), option("--vocab-size", st.just(1000)),
                             option("--gpus", st.sampled_from([8, 2**62])), option("--spread", st.just(1)),
                             option("--blocks-step", st.just(8))),
           rule_only=st.booleans())
    def check(params, options, rule_only):
        run("shape", "--params", str(params), *flat(options), *(["--rule-only"] if rule_only else []), "--json")

    check()


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_batch(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(grid=st.fixed_dictionaries({
        "models": maybe(st.just(["MODEL"]), st.one_of(HOSTILE, models().map(lambda m: [m]))),
        "systems": maybe(st.just(["SYSTEM"]), st.one_of(HOSTILE, systems().map(lambda s: [{**s, "name": "fuzz"}]))),
        "gpus": maybe(st.lists(st.sampled_from([1, 2, 8]), min_size=1, max_size=3)),
        "max_batch": maybe(st.just([4])),
        "grad_datatype": maybe(st.sampled_from(["float32", "16bit"])),
        "overrides": maybe(st.fixed_dictionaries({}, optional={"hbm_gib": HOSTILE_FLOATS, "offload_gib": HOSTILE_FLOATS,
                                                                "offload_gbps": HOSTILE, "nvlink_size": HOSTILE_INTS})),
        "time_limit_s": maybe(st.just(1.0))}))
    def check(grid):
        # The batch file is the input under test; solving its problems is fuzzed through solve.
        text = yaml.safe_dump(grid).replace("MODEL", str(Path(__file__).parents[1] / "problems/models/gpt-1.3b.yaml"))
        text = text.replace("SYSTEM", str(Path(__file__).parents[1] / "problems/systems/h100-80g-nvl8.yaml"))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(batch_command, "run_batch", lambda problems, out, **_: BatchSummary(
                len(problems), 0, 0, {}, False, 0.0, []))
            run("batch", write(workdir, "batch.yaml", text), "--out", str(workdir / "out"), "--quiet")

    check()


RECORD = st.fixed_dictionaries({"id": maybe(st.sampled_from(["a", "b"])),
                                "status": maybe(st.sampled_from(["optimal", "infeasible", "error"])),
                                "problem": maybe(st.fixed_dictionaries({"gpus": maybe(st.just(8)),
                                                                        "model": maybe(st.just({"params": 1e9}))})),
                                "best": maybe(st.one_of(st.none(), st.fixed_dictionaries({"mfu": maybe(st.just(0.5))})))})


@examples(default=FUZZ_EXAMPLES_DEFAULT, slow=FUZZ_EXAMPLES)
def test_fuzz_plot(memory_cap, workdir, examples):
    @fuzz(examples)
    @given(lines=st.lists(st.one_of(RECORD.map(json.dumps), st.text(max_size=8)), max_size=4),
           kind=st.sampled_from(KINDS))
    def check(lines, kind):
        # one kind per example: drawing every kind would spend the time in matplotlib
        results = workdir / "results"
        results.mkdir(exist_ok=True)
        (results / "results.jsonl").write_text("".join(line.replace("\n", " ") + "\n" for line in lines))
        run("plot", str(results), "--kind", kind, "--out", str(workdir / "plots"), "--quiet")

    check()
