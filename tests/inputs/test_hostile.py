"""Issue 17: hostile and extreme input. Each family of the issue's cases is one test,
parametrized over the values the issue lists: a one-line error naming the field, option or
file (exit 1, or 2 for command-line usage), or a correct answer; never a traceback, a hang,
unbounded memory or a silently wrong answer. The solver defects of issue 10 come last."""

from __future__ import annotations

import copy
import json
import math

import pytest
from click.testing import CliRunner
from ortools.sat.python import cp_model

from conftest import H100_SYSTEM, MODEL_DATA, MODELS_DIR, SYSTEM_DATA, assert_block_floors_below_exact, plain
from costmodel.errors import InputError, InternalError
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.cli.app import cli
from solver.search.cpsat import constraints
from solver.search.cpsat.constraints import Problem
from solver.search.cpsat.run import checked_solve
from solver.search.cpsat.model import structure_model
from solver.search.solve import SolveStatus, SolverConfig, solve
from solver.space.declaration import get_space, skeletons
from solver.space.factor import divisors, factorise
from tests.cli.test_cli_errors import assert_problem_error, assert_usage_error

MODEL = str(MODELS_DIR / "gpt-1.3b.yaml")
SYSTEM = str(H100_SYSTEM)
INT64_MAX = 2**63 - 1


@pytest.fixture
def mapsat():
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, [str(a) for a in args], prog_name="mapsat")


def changed(data: dict, *path_and_value) -> dict:
    """A deep copy of `data` with the field at `path` set to `value`."""
    *path, value = path_and_value
    data = copy.deepcopy(data)
    holder = data
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return data


def tiny_system() -> dict:
    """The test system with an outer network as large as the biggest GPU counts used here."""
    return changed(SYSTEM_DATA, "networks", 1, "size", 1 << 24)


# ---------------------------------------------------------------- MODEL_INVALID (root cause)

def test_model_invalid_is_an_internal_error_not_a_time_out():
    m = cp_model.CpModel()
    x = m.NewIntVar(0, INT64_MAX // 2, "x")
    m.Add(4 * x >= 1)  # 4·x may overflow int64: CP-SAT refuses the model
    with pytest.raises(InternalError, match=r"internal error: CP-SAT rejected the model as invalid \(.*overflow"):
        checked_solve(m, cp_model.CpSolver())


@pytest.mark.parametrize("args, kind, fragments", [
    (["model", "num_blocks", 1_000_000_000, "--gpus", 64], 1, ["field 'num_blocks' 1000000000", "above 2^20"]),
    (["model", "num_blocks", 2**30, "--gpus", 2**21], 1, ["field 'num_blocks' 1073741824", "above 2^20"]),
    (["--time-limit", "nan"], 2, ["'--time-limit'", "nan is not a finite number"]),
    (["--workers", 100_000], 2, ["'--workers'", "100000 is above 1,024"]),
], ids=["blocks-1e9", "blocks-2^30", "time-limit-nan", "workers-100000"])
def test_what_made_cpsat_model_invalid_is_refused_at_the_boundary(mapsat, write_file, args, kind, fragments):
    model = MODEL
    if args[0] == "model":
        model = str(write_file("model.yaml", changed(MODEL_DATA, args[1], args[2])))
        args = args[3:]
    system = str(write_file("system.yaml", tiny_system()))
    result = mapsat("solve", "--model", model, "--system", system, "--gpus", 8, "--json", *args)
    (assert_problem_error if kind == 1 else assert_usage_error)(result, *fragments)


def test_the_largest_accepted_model_is_solved_and_certified():
    # 2^20 blocks (the bound) of a tiny model on 2^21 GPUs: once never certified.
    model = Model(name="deep", hidden=8, feedforward=32, seq_size=8, attn_heads=2, attn_size=4, num_blocks=1 << 20,
                  vocab_size=16)
    result = solve(model, System.model_validate(tiny_system()), 1 << 21, config=SolverConfig(time_limit_s=60))
    assert result.status == SolveStatus.optimal and result.certified_optimal and result.gap == 0.0
    # CP-SAT proved it, or the exact block floors did before any round was needed
    assert result.cpsat_status in ("OPTIMAL", "INFEASIBLE") or (result.cpsat_status is None and result.rounds == 0)


# ---------------------------------------------------------------- once tracebacks

def collectives(**changes: tuple[float, float]) -> dict:
    """A network's collectives table: the ring defaults with some (bytes_factor, n_offset) changed."""
    table = {"p2p": (1.0, 0.0), "all_reduce": (2.0, -1.0), "reduce_scatter": (1.0, -1.0), "all_gather": (1.0, -1.0)}
    table.update(changes)
    return {op: {"bytes_factor": factor, "n_offset": offset} for op, (factor, offset) in table.items()}


@pytest.mark.parametrize("kind, path, value, fragments", [
    ("model", ("hidden",), 10**30, ["field 'hidden'", "above 2^20"]),
    ("system", ("hbm", "capacity_gib"), 1e308, ["field 'hbm.capacity_gib' 1e+308", "above 65,536"]),
    ("system", ("networks", 0, "latency_us"), 1e30, ["field 'networks.0.latency_us' 1e+30", "above 1,000,000"]),
    ("system", ("compute", "bfloat16", "matrix_tflops"), 1e-300,
     ["field 'compute.bfloat16.matrix_tflops' 1e-300", "below 0.001"]),
    ("system", ("networks", 1, "size"), 10**30, ["field 'networks.1.size'", "above 2^63 - 1"]),
    ("system", ("networks", 0, "collectives"), collectives(all_reduce=(1e300, -1)),
     ["field 'networks.0.collectives.all_reduce.bytes_factor' 1e+300", "above 1,024"]),
    ("system", ("hbm", "bandwidth_gbps"), 1e-300, ["field 'hbm.bandwidth_gbps' 1e-300", "below 0.001"]),
], ids=["hidden-1e30", "capacity-1e308", "latency-1e30", "tflops-1e-300", "network-size-1e30",
        "bytes-factor-1e300", "bandwidth-1e-300"])
def test_extreme_file_value_is_one_line(mapsat, write_file, kind, path, value, fragments):
    data = changed(MODEL_DATA if kind == "model" else SYSTEM_DATA, *path, value)
    written = str(write_file(f"{kind}.yaml", data))
    model, system = (written, SYSTEM) if kind == "model" else (MODEL, written)
    for command in ("solve", "brute", "count"):
        assert_problem_error(mapsat(command, "--model", model, "--system", system, "--gpus", 8), written, *fragments)


@pytest.mark.parametrize("args, kind, fragments", [
    (["--hbm-gib", "1e308"], 1, ["--hbm-gib: 1e+308 is above 65,536"]),
    (["--offload-gib", "1e308"], 1, ["--offload-gib: 1e+308 is above 65,536"]),
    (["--offload-gib", "64", "--offload-gbps", "1e-12"], 1, ["--offload-gbps: 1e-12 is below 0.001"]),
    (["--offload-gib", "64", "--offload-gbps", "1e-300"], 1, ["--offload-gbps: 1e-300 is below 0.001"]),
    (["--seed", str(2**40)], 2, ["'--seed'", "1099511627776 is above 2,147,483,647"]),
], ids=["hbm-1e308", "offload-1e308", "offload-gbps-1e-12", "offload-gbps-1e-300", "seed-2^40"])
def test_extreme_option_is_one_line(mapsat, args, kind, fragments):
    result = mapsat("solve", "--model", MODEL, "--system", SYSTEM, "--gpus", 8, *args)
    (assert_problem_error if kind == 1 else assert_usage_error)(result, *fragments)


@pytest.mark.parametrize("name, text", [
    ("deep.yaml", "hidden: " + "[" * 50_000 + "]" * 50_000 + "\n"),
    ("deep.json", '{"hidden": ' + "[" * 50_000 + "]" * 50_000 + "}"),
    ("nested.yaml", "hidden: " + "[" * 100 + "]" * 100 + "\n"),
])
def test_deeply_nested_file_is_one_line(mapsat, write_file, name, text):
    path = str(write_file(name, text))
    assert_problem_error(mapsat("count", "--model", path, "--system", SYSTEM, "--gpus", 8), path, "nested")


# ---------------------------------------------------------------- once hangs

@pytest.mark.parametrize("command, args, kind, fragments", [
    ("solve", ["--gpus", 10**30], 2, ["'--gpus'", "above 2^24"]),
    ("solve", ["--gpus", 8, "--max-batch", 2**62], 2, ["'--max-batch'", "above 2^24"]),
    ("shape", ["--params", "1e12", "--gpus", 10**30], 2, ["'--gpus'", "above 2^63 - 1"]),
    ("count", ["--gpus", 8, "--max-batch", 2**62, "--feasible"], 2, ["'--max-batch'", "--feasible scores"]),
], ids=["solve-gpus-1e30", "solve-max-batch-2^62", "shape-gpus-1e30", "count-feasible-max-batch-2^62"])
def test_absurd_count_for_a_search_is_refused(mapsat, command, args, kind, fragments):
    files = [] if command == "shape" else ["--model", MODEL, "--system", SYSTEM]
    assert_usage_error(mapsat(command, *files, *args), *fragments)


@pytest.mark.parametrize("gpus, max_batch, space, expected", [
    (INT64_MAX, 3072, "full", 0),            # 7²·73·127·337·92737·649657: no tp <= 256 divides hidden too
    (2**62, 3072, "full", 0),                # dp > the cap in every split
    (2**62, 2**62, "calculon-2023", None),   # counted in closed form
], ids=["int64-max", "2^62", "2^62-batch-2^62"])
def test_count_answers_any_64_bit_gpu_count(mapsat, gpus, max_batch, space, expected):
    result = mapsat("count", "--model", MODEL, "--system", SYSTEM, "--gpus", gpus, "--max-batch", max_batch,
                    "--space", space, "--json")
    assert result.exit_code == 0, result.output
    counted = json.loads(result.output)
    assert counted["gpus"] == gpus and counted["max_batch"] == max_batch
    if expected is not None:
        assert counted["mappings"] == expected
    else:  # the closed form adds up: every dimension's breakdown sums to the total
        assert counted["mappings"] > 0
        assert all(sum(values.values()) == counted["mappings"] for values in counted["by_dimension"].values())


def test_count_of_a_model_with_2_63_blocks_is_refused(mapsat, write_file):
    path = str(write_file("model.yaml", changed(MODEL_DATA, "num_blocks", 2**63)))
    assert_problem_error(mapsat("count", "--model", path, "--system", SYSTEM, "--gpus", 8),
                         "field 'num_blocks' 9223372036854775808", "above 2^20")


@pytest.mark.parametrize("n", [1, 2, 12, 97, 2**31 - 1, 4294967291 * 4294967279, 2**62, INT64_MAX, 2**64 - 1,
                               (2**32 - 5)**2, 600851475143, 18446744073709551557])
def test_divisors_by_factorisation(n):
    found = divisors(n)
    assert found[0] == 1 and found[-1] == n and list(found) == sorted(set(found))
    assert all(n % d == 0 for d in found)
    assert len(found) == math.prod(e + 1 for _, e in factorise(n))
    assert math.prod(p**e for p, e in factorise(n)) == n
    if n < 10**6:
        assert found == tuple(d for d in range(1, n + 1) if n % d == 0)


def test_divisors_agree_with_trial_division_on_small_numbers():
    for n in range(1, 3000):
        small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
        assert divisors(n) == tuple(small + [n // d for d in reversed(small) if d * d != n])


# ---------------------------------------------------------------- once unbounded memory

def _batch(write_file, text: str) -> str:
    return str(write_file("batch.yaml", text.replace("MODEL", MODEL).replace("SYSTEM", SYSTEM)))


@pytest.mark.parametrize("text, fragments", [
    ("m: &a0 {name: m, hidden: 64, feedforward: 256, seq_size: 64, attn_heads: 4, attn_size: 16, num_blocks: 2}\n"
     + "".join(f"l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10))
     + "models: [*a9]\nsystems: [SYSTEM]\ngpus: [8]\n", ["more than 100,000 values", "alias bomb"]),
    ("models: [MODEL]\nsystems: [SYSTEM]\ngpus: [" + ", ".join(map(str, range(1, 1001))) + "]\n"
     "max_batch: [" + ", ".join(map(str, range(1, 1001))) + "]\n",
     ["expands to 1,000,000 problems (gpus 1000 × max_batch 1000), more than 10,000", "split it"]),
    ("a: &x [1, *x]\nmodels: [MODEL]\nsystems: [SYSTEM]\ngpus: [8]\n", ["an alias refers to a value that contains it"]),
], ids=["alias-bomb", "million-problem-grid", "self-alias"])
def test_batch_that_would_exhaust_memory_is_refused(mapsat, write_file, tmp_path, text, fragments):
    path = _batch(write_file, text)
    assert_problem_error(mapsat("batch", path, "--out", tmp_path / "out", "--quiet"), path, *fragments)
    assert not (tmp_path / "out").exists()


def test_top_k_of_a_billion_is_refused(mapsat):
    for command in ("solve", "brute"):
        result = mapsat(command, "--model", MODEL, "--system", SYSTEM, "--gpus", 8, "--top-k", 10**9)
        assert_usage_error(result, "'--top-k'", "1000000000 is above 1,000")


# ---------------------------------------------------------------- once silently wrong or unclear

@pytest.mark.parametrize("n_offset, fragments", [
    (-5, ["field 'networks.0.collectives.p2p.n_offset' -5", "below -2", "negative bytes"]),
    (-2.5, ["n_offset' -2.5", "below -2"]),
    (0.5, ["n_offset' 0.5", "less than or equal to 0"]),
])
def test_collective_offset_that_would_move_negative_bytes_is_refused(write_file, n_offset, fragments):
    path = write_file("system.yaml", changed(SYSTEM_DATA, "networks", 0, "collectives",
                                             collectives(p2p=(1.0, n_offset))))
    with pytest.raises(InputError) as excinfo:
        load_system(path)
    assert all(fragment in str(excinfo.value) for fragment in fragments), str(excinfo.value)


def test_collective_offset_at_its_bound_moves_no_negative_time(write_file):
    # n_offset -2 is the lowest that keeps n + n_offset >= 0 for n >= 2: nothing negative, nothing above the roofline
    system = load_system(write_file("system.yaml", changed(tiny_system(), "networks", 0, "collectives",
                                                           collectives(p2p=(1.0, -2.0), all_reduce=(2.0, -2.0)))))
    result = solve(load_model(MODELS_DIR / "gpt-1.3b.yaml"), system, 8, config=SolverConfig(top_k=1))
    best = result.best
    assert best is not None and all(value >= 0 for value in best.time.as_dict().values())
    assert best.mfu <= best.hfu <= 0.9 + 1e-9   # the test GPU's matrix efficiency plateau


@pytest.mark.parametrize("command, args, message", [
    ("count", ["model", {"attn_heads": 7, "hidden": 5000}], "attn_heads 7 does not divide hidden 5000 (usually hidden = "
                                                            "heads × head size); tp must divide hidden, heads and "
                                                            "feedforward, so tp can only be 1"),
    ("solve", ["--offload-gib", "0", "--offload-gbps", "100"],
     "--offload-gbps 100 is ignored: --offload-gib 0 removes the offload memory"),
], ids=["heads-do-not-divide-hidden", "offload-bandwidth-without-offload"])
def test_probable_mistake_is_a_warning_that_quiet_silences(mapsat, write_file, command, args, message):
    model = MODEL
    if args[0] == "model":
        model = str(write_file("model.yaml", {**MODEL_DATA, **args[1]}))
        args = []
    base = [command, "--model", model, "--system", SYSTEM, "--gpus", 8, "--json", *args]
    loud, quiet = mapsat(*base), mapsat(*base, "--quiet")
    assert loud.exit_code == quiet.exit_code == 0, loud.output
    assert [line for line in loud.stderr.splitlines() if line.startswith("warning: ")] == [
        f"warning: {model + ': ' if command == 'count' else ''}{message}"]
    assert quiet.stderr == "" and json.loads(quiet.stdout) == json.loads(loud.stdout) | {
        "seconds": json.loads(quiet.stdout)["seconds"]}


@pytest.mark.parametrize("option", ["--model", "--system"])
def test_file_option_given_twice_is_a_usage_error(mapsat, option):
    other = str(MODELS_DIR / "gpt3-13b.yaml") if option == "--model" else SYSTEM
    files = {"--model": MODEL, "--system": SYSTEM}
    args = ["count", option, files[option], option, other,
            *[a for flag, path in files.items() if flag != option for a in (flag, path)], "--gpus", 8]
    assert_usage_error(mapsat(*args), f"'{option}'", "given 2 times", "give it once")


def test_mapping_given_twice_is_a_usage_error(mapsat):
    mapping = str(MODELS_DIR.parent / "mappings" / "gpt-1.3b-bf16-8gpu.json")
    result = mapsat("eval", "--model", MODEL, "--system", SYSTEM, "--mapping", mapping, "--mapping", mapping)
    assert_usage_error(result, "'--mapping'", "given 2 times")


def test_count_of_a_model_too_wide_is_refused(mapsat, write_file):
    path = str(write_file("model.yaml", changed(MODEL_DATA, "hidden", 10**30)))
    assert_problem_error(mapsat("count", "--model", path, "--system", SYSTEM, "--gpus", 8), "field 'hidden'",
                         "above 2^20")


def test_batch_override_past_its_bound_names_the_field(mapsat, write_file, tmp_path):
    path = _batch(write_file, "models: [MODEL]\nsystems: [SYSTEM]\ngpus: [8]\noverrides: {offload_gib: 1.0e+308}\n")
    assert_problem_error(mapsat("batch", path, "--out", tmp_path / "out"), path,
                         "field 'overrides.offload_gib.0' 1e+308", "above 65,536")


def test_plot_of_garbage_names_the_file_and_the_lines(mapsat, tmp_path):
    (tmp_path / "results.jsonl").write_text('garbage\n{"id": 7}\n[1, 2]\n')
    assert_problem_error(mapsat("plot", tmp_path), str(tmp_path / "results.jsonl"),
                         "none of its lines is a result record (3 line(s) are not: 1, 2, 3)")


def test_bandwidth_far_below_any_memory_is_an_error_not_a_numpy_warning(mapsat, write_file):
    path = str(write_file("system.yaml", changed(SYSTEM_DATA, "hbm", "bandwidth_gbps", 1e-300)))
    result = mapsat("count", "--model", MODEL, "--system", path, "--gpus", 8)
    assert "RuntimeWarning" not in result.output
    assert_problem_error(result, "field 'hbm.bandwidth_gbps' 1e-300")


# ---------------------------------------------------------------- issue 10: the solver

def test_network_fit_is_added_once(monkeypatch):
    calls = []
    original = constraints.NetworkFit.add
    monkeypatch.setattr(constraints.NetworkFit, "add", lambda self, *a: (calls.append(1), original(self, *a))[1])
    model, system = load_model(MODELS_DIR / "gpt-1.3b.yaml"), load_system(H100_SYSTEM)
    space = get_space("full")
    structure_model(Problem(model, system, 8, 3072, space), skeletons(model, 8, 3072, space))
    assert len(calls) == 1


@pytest.mark.parametrize("time_limit_s", [1e-6, 0.001, 0.05])
def test_short_time_limit_gives_a_consistent_status(mapsat, time_limit_s):
    result = mapsat("solve", "--model", MODEL, "--system", SYSTEM, "--gpus", 8, "--json",
                    "--time-limit", time_limit_s)
    answer = json.loads(result.stdout)
    if answer["best"] is None:   # no incumbent: unknown, exit 1 with a one-line reason
        assert answer["status"] == "unknown" and not answer["certified_optimal"] and answer["gap"] is None
        assert result.exit_code == 1 and result.stderr.startswith("error: no mapping found within the time limit")
    elif answer["certified_optimal"]:
        assert answer["status"] == "optimal" and answer["gap"] == 0.0 and result.exit_code == 0
    else:
        assert answer["status"] == "feasible" and result.exit_code == 0
        assert answer["bound_s"] <= answer["best"]["iteration_time_s"] and 0 <= answer["gap"] <= 1


def test_certified_answer_carries_cpsat_status():
    result = solve(load_model(MODELS_DIR / "gpt-1.3b.yaml"), load_system(H100_SYSTEM), 8)
    status = result.to_dict()["cpsat_status"]
    assert result.certified_optimal and "cpsat_status" in result.to_dict()
    # CP-SAT's own word, or none when the exact block floors certified before any round
    assert status in ("OPTIMAL", "INFEASIBLE") or (status is None and result.rounds == 0)


@pytest.mark.parametrize("field, value", [("time_limit_s", math.nan), ("time_limit_s", math.inf),
                                          ("workers", 10**5), ("seed", 2**40), ("top_k", 10**9)])
def test_solver_config_refuses_what_cpsat_cannot_take(field, value):
    with pytest.raises(InputError, match=f"solver {field}"):
        SolverConfig(**{field: value})


@pytest.mark.parametrize("gpus, offload", [(8, None), pytest.param(16, 64, marks=pytest.mark.slow)])   # 16: ~7 s
def test_block_floors_never_exceed_an_exact_time_in_their_block(gpus, offload):
    # The floors certify and cut blocks, so each must sit at or below every feasible exact
    # time of its block, rounding included (TIME_FLOOR_SLACK).
    model = load_model(MODELS_DIR / "gpt-1.3b.yaml")
    system = load_system(H100_SYSTEM).with_overrides(offload_gib=offload, offload_gbps=100 if offload else None)
    # as before cp_comm and hybrid sharding (their floors: test_cp_comm.py, test_hybrid_sharding.py)
    checked = len(assert_block_floors_below_exact(model, system, gpus, 256, Datatype.bfloat16,
                                                  plain(get_space("full"))))
    assert checked > 10
