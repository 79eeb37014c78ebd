"""The `mapsat` command line through click's CliRunner: the group, its help and version, that
every command is documented with an example, and how the shared helpers turn bad input into
one-line errors with the right exit status."""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
from importlib.metadata import version
from typing import Callable

import click
import pytest
from click.testing import CliRunner

from conftest import A100_SYSTEM, H100_SYSTEM, MAPPING_DATA, MAPPINGS_DIR, MODEL_DATA, MODELS_DIR, REPO, SYSTEM_DATA
from costmodel.errors import InputError
from solver.cli.app import cli
from solver.cli.options import load_problem, problem_options, user_errors

COMMANDS = sorted(cli.commands)


@pytest.fixture
def mapsat():
    """mapsat(*args) -> click Result: runs the real command group as the `mapsat` program."""
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, list(args), prog_name="mapsat")


def test_group_help(mapsat):
    result = mapsat("--help")
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output
    assert "Example:" in result.output
    assert "mapsat solve --model problems/models/" in result.output
    assert "--debug" in result.output


def test_group_help_example_is_the_readme_main_job(mapsat):
    def solve_args(text: str) -> list[str]:
        command = re.search(r"mapsat solve (.*?)(?:\n\s*\n|\n```|$)", text.replace("\\\n", " "), re.DOTALL)
        assert command, text
        return command.group(1).split()

    readme = (REPO / "README.md").read_text()
    assert solve_args(mapsat("--help").output) == solve_args(readme.split("## On a fresh machine", 1)[1])


def test_short_help_option(mapsat):
    result = mapsat("-h")
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output


def test_version(mapsat):
    result = mapsat("--version")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"mapsat, version {version('mapsat')}"


def test_unknown_command_is_a_usage_error(mapsat):
    result = mapsat("slove")
    assert result.exit_code == 2
    assert "No such command 'slove'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_with_an_example(mapsat, name):
    result = mapsat(name, "--help")
    assert result.exit_code == 0, result.output
    assert f"Usage: mapsat {name}" in result.output
    assert "Example" in result.output, f"`mapsat {name} --help` shows no example"
    assert f"mapsat {name}" in result.output.split("Example", 1)[1], f"`mapsat {name}` example missing"
    assert cli.commands[name].get_short_help_str(), f"`mapsat {name}` has no one-line summary in `mapsat --help`"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_is_in_the_readme(name):
    table = (REPO / "README.md").read_text()
    assert re.search(rf"^\| `mapsat {name}` \|", table, re.MULTILINE), f"README.md's command table lacks `mapsat {name}`"


# ---- the shared helpers (user_errors, problem_options, load_problem), through a probe command
# registered on the real group for one test and removed after it.


@click.command("probe-inputs")
@problem_options
@user_errors
def _probe(model_path, system_path, seq_size, hbm_gib, offload_gib, offload_gbps, nvlink_size):
    """Load a problem and print what was loaded."""
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    offload = system.offload.capacity_gib if system.offload else 0
    click.echo(f"{model.name} on {system.name}: hbm {system.hbm.capacity_gib} GiB, offload {offload} GiB")


@click.command("probe-raise")
@user_errors
def _probe_raise():
    """Fail the way a library call fails on bad input."""
    raise InputError("model.yaml: field 'hidden' 0: Input should be greater than 0")


@pytest.fixture
def probes():
    for command in (_probe, _probe_raise):
        cli.add_command(command)
    yield
    for command in (_probe, _probe_raise):
        cli.commands.pop(command.name)


MODEL = str(MODELS_DIR / "gpt-1.3b.yaml")
SYSTEM = str(H100_SYSTEM)


def test_probe_loads_a_problem_with_overrides(mapsat, probes):
    result = mapsat("probe-inputs", "--model", MODEL, "--system", SYSTEM,
                    "--hbm-gib", "120", "--offload-gib", "1024", "--offload-gbps", "100")
    assert result.exit_code == 0, result.output
    assert result.output == "gpt-1.3b on h100-80g-nvl8: hbm 120.0 GiB, offload 1024.0 GiB\n"


def test_input_error_is_one_line_and_exit_1(mapsat, probes):
    result = mapsat("probe-raise")
    assert result.exit_code == 1
    assert result.output == "error: model.yaml: field 'hidden' 0: Input should be greater than 0\n"


def test_debug_shows_the_exception(mapsat, probes):
    result = mapsat("--debug", "probe-raise")
    assert result.exit_code == 1
    assert isinstance(result.exception, InputError)


def test_missing_model_file_exit_1(mapsat, probes, tmp_path):
    missing = tmp_path / "missing.yaml"
    result = mapsat("probe-inputs", "--model", str(missing), "--system", SYSTEM)
    assert result.exit_code == 1
    assert result.output == f"error: {missing}: no such file\n"


def test_bad_model_file_exit_1(mapsat, probes, write_file, model_data):
    model_data["hidden"] = 0
    path = write_file("model.yaml", model_data)
    result = mapsat("probe-inputs", "--model", str(path), "--system", SYSTEM)
    assert result.exit_code == 1
    assert result.output == f"error: {path}: field 'hidden' 0: Input should be greater than 0\n"


def test_missing_required_option_exit_2(mapsat, probes):
    result = mapsat("probe-inputs", "--model", MODEL)
    assert result.exit_code == 2
    assert "Missing option '--system'" in result.output


def test_directory_as_model_exit_2(mapsat, probes, tmp_path):
    result = mapsat("probe-inputs", "--model", str(tmp_path), "--system", SYSTEM)
    assert result.exit_code == 2
    assert "is a directory" in result.output


@pytest.mark.parametrize("option, value", [("--hbm-gib", "lots"), ("--nvlink-size", "8.5")])
def test_override_that_is_not_a_number_exit_2(mapsat, probes, option, value):
    result = mapsat("probe-inputs", "--model", MODEL, "--system", SYSTEM, option, value)
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.output
    assert repr(value) in result.output


@pytest.mark.parametrize("args, message", [
    (["--hbm-gib", "-1"], "error: --hbm-gib: -1.0 must be > 0\n"),
    (["--offload-gbps", "100"],
     "error: --offload-gbps: system 'h100-80g-nvl8' has no offload memory; give --offload-gib too\n"),
    (["--nvlink-size", "0"], "error: --nvlink-size: 0 must be > 0\n"),
])
def test_override_out_of_range_exit_1(mapsat, probes, args, message):
    result = mapsat("probe-inputs", "--model", MODEL, "--system", SYSTEM, *args)
    assert result.exit_code == 1
    assert result.output == message


# ---------------------------------------------------------------- bad input, command by command
# Issue 6: every kind of bad input gives one line naming the file, field or value, exit status
# 2 (command-line usage) or 1 (a problem with the input), and no traceback. Commands that do
# not exist yet are picked up when they are registered (see the tables below).

MAPPING = str(MAPPINGS_DIR / "gpt-1.3b-bf16-8gpu.json")
A100 = str(A100_SYSTEM)

# How each command is invoked on a valid problem; a case swaps one file or adds options.
# The valid problem is small (1.3B on 8 GPUs) so a case that does not fail still ends fast.
PROBLEM_COMMANDS = {
    "eval": ["--mapping", MAPPING],
    "count": ["--gpus", "8"],
    "brute": ["--gpus", "8", "--workers", "1", "--json"],
    "solve": ["--gpus", "8", "--json"],
}
PROBLEM_COMMANDS = {name: args for name, args in PROBLEM_COMMANDS.items() if name in cli.commands}
SPACE_COMMANDS = [name for name in ("count", "brute", "solve") if name in PROBLEM_COMMANDS]


def problem_args(command: str, model: str = MODEL, system: str = SYSTEM, mapping: str | None = None) -> list[str]:
    args = [command, "--model", model, "--system", system, *PROBLEM_COMMANDS[command]]
    if mapping is not None:
        args[args.index("--mapping") + 1] = mapping
    return args


def assert_problem_error(result, *fragments: str) -> str:
    """Exit 1, and stderr is exactly one line `error: ...` holding every fragment; no traceback."""
    assert result.exit_code == 1, f"exit {result.exit_code}: {result.output}"
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"not one error line: {result.stderr!r}"
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def assert_usage_error(result, *fragments: str) -> str:
    """Exit 2 (click's usage error): one `Error: ...` line holding every fragment; no traceback."""
    assert result.exit_code == 2, f"exit {result.exit_code}: {result.output}"
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
    return errors[0]


def _broken(data: dict, change: Callable[[dict], None]) -> dict:
    data = copy.deepcopy(data)
    change(data)
    return data


def _set(*path_and_value):
    *path, value = path_and_value

    def change(data):
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value
    return change


def _rename(*path_and_new):
    *path, new = path_and_new

    def change(data):
        for key in path[:-1]:
            data = data[key]
        data[new] = data.pop(path[-1])
    return change


def _delete(*path):
    def change(data):
        for key in path[:-1]:
            data = data[key]
        del data[path[-1]]
    return change


# (case id, file name, content or None for "no such file", fragments of the one-line error)
MODEL_CASES = [
    ("malformed-yaml", "model.yaml", "hidden: 1024\nfeedforward: [4096\nseq_size: 2048\n", ["not valid YAML at line"]),
    ("malformed-json", "model.json", '{"hidden": 1024,}', ["not valid JSON at line 1"]),
    ("empty", "model.yaml", "", ["is empty"]),
    ("not-a-mapping", "model.yaml", "- 1024\n", ["expected a mapping of field names to values, got list"]),
    ("missing-field", "model.yaml", _broken(MODEL_DATA, _delete("num_blocks")), ["missing field 'num_blocks'"]),
    ("unknown-field", "model.yaml", _broken(MODEL_DATA, _rename("num_blocks", "num_block")),
     ["unknown field 'num_block' (did you mean 'num_blocks'?)"]),
    ("wrong-type", "model.yaml", _broken(MODEL_DATA, _set("hidden", "wide")), ["field 'hidden' 'wide'"]),
    ("boolean-size", "model.yaml", _broken(MODEL_DATA, _set("num_blocks", True)),
     ["field 'num_blocks' True", "not a whole number"]),
    ("zero-size", "model.yaml", _broken(MODEL_DATA, _set("hidden", 0)), ["field 'hidden' 0", "greater than 0"]),
    ("negative-size", "model.yaml", _broken(MODEL_DATA, _set("num_blocks", -24)),
     ["field 'num_blocks' -24", "greater than 0"]),
    ("fractional-size", "model.yaml", _broken(MODEL_DATA, _set("num_blocks", 12.5)),
     ["field 'num_blocks' 12.5: not a whole number"]),
    ("missing-file", "model.yaml", None, ["no such file"]),
]
SYSTEM_CASES = [
    ("malformed-yaml", "system.yaml", "hbm: {capacity_gib: 80\n", ["not valid YAML at line"]),
    ("empty", "system.yaml", "# nothing yet\n", ["is empty"]),
    ("missing-field", "system.yaml", _broken(SYSTEM_DATA, _delete("hbm")), ["missing field 'hbm'"]),
    ("unknown-nested-field", "system.yaml", _broken(SYSTEM_DATA, _rename("networks", 0, "latency_us", "latncy_us")),
     ["unknown field 'networks.0.latncy_us' (did you mean 'latency_us'?)"]),
    ("wrong-type", "system.yaml", _broken(SYSTEM_DATA, _set("hbm", "capacity_gib", "big")),
     ["field 'hbm.capacity_gib' 'big'"]),
    ("zero-size", "system.yaml", _broken(SYSTEM_DATA, _set("networks", 0, "size", 0)),
     ["field 'networks.0.size' 0", "greater than 0"]),
    ("fractional-size", "system.yaml", _broken(SYSTEM_DATA, _set("networks", 0, "size", 8.5)),
     ["field 'networks.0.size' 8.5: not a whole number"]),
    ("not-finite", "system.yaml", _broken(SYSTEM_DATA, _set("hbm", "bandwidth_gbps", math.inf)),
     ["field 'hbm.bandwidth_gbps' inf", "finite number"]),
    ("unknown-datatype", "system.yaml", _broken(SYSTEM_DATA, _rename("compute", "bfloat16", "bf16")),
     ["field 'compute' key 'bf16'"]),
    ("missing-file", "system.yaml", None, ["no such file"]),
]
MAPPING_CASES = [
    ("malformed-json", "mapping.json", '{\n  "num_procs": 8,\n}\n', ["not valid JSON at line 3"]),
    ("empty", "mapping.json", "", ["is empty"]),
    ("missing-field", "mapping.json", _broken(MAPPING_DATA, _delete("tensor_par")), ["missing field 'tensor_par'"]),
    ("unknown-field", "mapping.json", _broken(MAPPING_DATA, _rename("tensor_par", "tensor_parallel")),
     ["unknown field 'tensor_parallel' (did you mean 'tensor_par'?)"]),
    ("wrong-type", "mapping.json", _broken(MAPPING_DATA, _set("tensor_par", "two")), ["field 'tensor_par' 'two'"]),
    ("zero-size", "mapping.json", _broken(MAPPING_DATA, _set("microbatch_size", 0)),
     ["field 'microbatch_size' 0", "greater than 0"]),
    ("fractional-size", "mapping.json", _broken(MAPPING_DATA, _set("batch_size", 16.5)),
     ["field 'batch_size' 16.5: not a whole number"]),
    ("tp-pp-dp-differs-from-gpus", "mapping.json", _broken(MAPPING_DATA, _set("data_par", 3)),
     ["tensor_par(2)·pipeline_par(4)·data_par(3)=24 ≠ num_procs(16)"]),
    ("does-not-fit-the-model", "mapping.json",
     _broken(MAPPING_DATA, lambda m: m.update(tensor_par=3, num_procs=24, batch_size=16, data_par=2)),
     ["tensor_par(3) does not divide attn_heads(16)"]),
    ("missing-file", "mapping.json", None, ["no such file"]),
]


def _write_case(write_file, tmp_path, name: str, content) -> str:
    return str(write_file(name, content)) if content is not None else str(tmp_path / f"missing-{name}")


def _cases(cases, commands):
    return [pytest.param(command, name, content, fragments, id=f"{command}-{case}")
            for command in commands for case, name, content, fragments in cases]


@pytest.mark.parametrize("command, name, content, fragments", _cases(MODEL_CASES, PROBLEM_COMMANDS))
def test_bad_model_file(mapsat, write_file, tmp_path, command, name, content, fragments):
    path = _write_case(write_file, tmp_path, name, content)
    assert_problem_error(mapsat(*problem_args(command, model=path)), path, *fragments)


@pytest.mark.parametrize("command, name, content, fragments",
                         _cases(SYSTEM_CASES, [*PROBLEM_COMMANDS, "validate"]))
def test_bad_system_file(mapsat, write_file, tmp_path, command, name, content, fragments):
    path = _write_case(write_file, tmp_path, name, content)
    args = ["validate", "--system", path] if command == "validate" else problem_args(command, system=path)
    assert_problem_error(mapsat(*args), path, *fragments)


@pytest.mark.parametrize("command, name, content, fragments", _cases(MAPPING_CASES, ["eval"]))
def test_bad_mapping_file(mapsat, write_file, tmp_path, command, name, content, fragments):
    path = _write_case(write_file, tmp_path, name, content)
    # The mapping cases are written against the small test model (conftest.MODEL_DATA).
    model = str(write_file("tiny.yaml", MODEL_DATA))
    assert_problem_error(mapsat(*problem_args(command, model=model, mapping=path)), *fragments)


def test_eval_mapping_datatype_the_system_does_not_have(mapsat):
    # The mapping is in bfloat16 ... on an A100 that has it; float8 it has not.
    mapping = str(MAPPINGS_DIR / "gpt3-175b-h100-fp8-512gpu.json")
    result = mapsat("eval", "--model", str(MODELS_DIR / "gpt3-175b.yaml"), "--system", A100, "--mapping", mapping)
    assert_problem_error(result, "datatype", "'a100-80g-selene' has no float8 compute", "it has")


@pytest.mark.parametrize("command", [name for name in ("brute", "solve") if name in PROBLEM_COMMANDS])
def test_datatype_the_system_does_not_have(mapsat, command):
    result = mapsat(*problem_args(command, system=A100), "--datatype", "float8")
    assert_problem_error(result, "datatype", "'a100-80g-selene' has no float8 compute", "it has")


def test_count_feasible_datatype_the_system_does_not_have(mapsat):
    result = mapsat(*problem_args("count", system=A100), "--feasible", "--datatype", "float8")
    assert_problem_error(result, "datatype", "'a100-80g-selene' has no float8 compute")


def test_count_datatype_the_system_does_not_have(mapsat):
    result = mapsat(*problem_args("count", system=A100), "--datatype", "float8")
    assert_problem_error(result, "has no float8 compute")


@pytest.mark.parametrize("command", SPACE_COMMANDS)
@pytest.mark.parametrize("gpus, fragments", [
    ("0", ["'--gpus'", "0 is not in the range"]),
    ("-8", ["'--gpus'", "-8 is not in the range"]),
    ("many", ["'--gpus'", "'many' is not a valid integer"]),
    ("8.5", ["'--gpus'", "'8.5' is not a valid integer"]),
])
def test_bad_gpu_count_is_a_usage_error(mapsat, command, gpus, fragments):
    args = problem_args(command)
    args[args.index("--gpus") + 1] = gpus
    assert_usage_error(mapsat(*args), *fragments)


@pytest.mark.parametrize("command", PROBLEM_COMMANDS)
@pytest.mark.parametrize("options, fragments", [
    (["--hbm-gib", "nan"], ["--hbm-gib: nan is not a finite number"]),
    (["--hbm-gib", "inf"], ["--hbm-gib: inf is not a finite number"]),
    (["--hbm-gib", "0"], ["--hbm-gib: 0.0 must be > 0"]),
    (["--offload-gib", "-1"], ["--offload-gib: -1.0 must be >= 0"]),
    (["--offload-gib", "64", "--offload-gbps", "0"], ["--offload-gbps: 0.0 must be > 0"]),
    (["--offload-gbps", "100"], ["--offload-gbps", "has no offload memory", "--offload-gib"]),
    (["--nvlink-size", "0"], ["--nvlink-size: 0 must be > 0"]),
    (["--nvlink-size", "100000"], ["--nvlink-size: 100000 is larger than the next network", "infiniband"]),
], ids=["hbm-nan", "hbm-inf", "hbm-zero", "offload-negative", "offload-gbps-zero", "offload-gbps-without-tier",
        "nvlink-zero", "nvlink-above-next-network"])
def test_bad_override_is_a_problem(mapsat, command, options, fragments):
    assert_problem_error(mapsat(*problem_args(command), *options), *fragments)


@pytest.mark.parametrize("command", PROBLEM_COMMANDS)
@pytest.mark.parametrize("options, fragments", [
    (["--hbm-gib", "lots"], ["'--hbm-gib'", "'lots' is not a valid float"]),
    (["--nvlink-size", "eight"], ["'--nvlink-size'", "'eight' is not a valid integer"]),
    (["--no-such-option"], ["No such option", "--no-such-option"]),
], ids=["hbm-not-a-number", "nvlink-not-a-number", "unknown-option"])
def test_bad_option_is_a_usage_error(mapsat, command, options, fragments):
    assert_usage_error(mapsat(*problem_args(command), *options), *fragments)


@pytest.mark.parametrize("command", SPACE_COMMANDS)
@pytest.mark.parametrize("options, fragments", [
    (["--datatype", "fp8"], ["'--datatype'", "unknown datatype 'fp8': use --datatype float8"]),
    (["--datatype", "fp9"], ["'--datatype'", "'fp9' is not one of"]),
    (["--max-batch", "0"], ["'--max-batch'", "0 is not in the range"]),
    (["--space", "calculon"], ["'--space'", "'calculon' is not one of"]),
], ids=["datatype-short-name", "datatype-unknown", "max-batch-zero", "space-unknown"])
def test_bad_space_option_is_a_usage_error(mapsat, command, options, fragments):
    assert_usage_error(mapsat(*problem_args(command), *options), *fragments)


@pytest.mark.parametrize("command, options, fragments", [
    pytest.param(command, options, fragments, id=f"{command}-{'-'.join(o.lstrip('-') for o in options)}")
    for command, options, fragments in [
        ("brute", ["--top-k", "0"], ["'--top-k'", "0 is not in the range"]),
        ("brute", ["--workers", "0"], ["'--workers'", "0 is not in the range"]),
        ("count", ["--workers", "0"], ["'--workers'", "0 is not in the range"]),
        ("solve", ["--top-k", "0"], ["'--top-k'", "0 is not in the range"]),
        ("solve", ["--workers", "0"], ["'--workers'", "0 is not in the range"]),
        ("solve", ["--time-limit", "0"], ["'--time-limit'", "0"]),
        ("solve", ["--time-limit", "soon"], ["'--time-limit'", "'soon'"]),
    ] if command in PROBLEM_COMMANDS])
def test_bad_search_option_is_a_usage_error(mapsat, command, options, fragments):
    assert_usage_error(mapsat(*problem_args(command), *options), *fragments)


@pytest.mark.parametrize("command", PROBLEM_COMMANDS)
@pytest.mark.parametrize("missing", ["--model", "--system"])
def test_missing_required_file_option_is_a_usage_error(mapsat, command, missing):
    args = problem_args(command)
    at = args.index(missing)
    del args[at:at + 2]
    assert_usage_error(mapsat(*args), f"Missing option '{missing}'")


@pytest.mark.parametrize("args, fragments", [
    (["spaces", "--no-such-option"], ["No such option", "--no-such-option"]),
    (["spaces", "extra"], ["unexpected extra argument (extra)"]),
    (["validate", "--system"], ["Option '--system' requires an argument"]),
])
def test_commands_without_a_problem_reject_bad_usage(mapsat, args, fragments):
    assert_usage_error(mapsat(*args), *fragments)


@pytest.mark.parametrize("command", [*PROBLEM_COMMANDS, "validate"])
def test_debug_shows_the_exception_for_every_command(mapsat, write_file, command):
    path = str(write_file("model.yaml", _broken(MODEL_DATA, _set("hidden", 0))))
    bad_system = str(write_file("system.yaml", "hbm: [\n"))
    args = ["validate", "--system", bad_system] if command == "validate" else problem_args(command, model=path)
    result = mapsat("--debug", *args)
    assert result.exit_code == 1
    assert isinstance(result.exception, InputError)


def test_debug_prints_the_traceback_in_a_real_process(write_file):
    # The installed entry point (solver.cli:main), not CliRunner: what a user's terminal shows.
    # Without --debug the CliRunner tests above already prove no exception escapes main().
    path = str(write_file("model.yaml", _broken(MODEL_DATA, _rename("num_blocks", "num_block"))))
    args = ["--debug", "count", "--model", path, "--system", SYSTEM, "--gpus", "8"]
    run = subprocess.run([sys.executable, "-c", "from solver.cli.app import main; main()", *args],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 1
    assert run.stdout == ""
    assert "Traceback" in run.stderr
    assert run.stderr.rstrip().endswith(f"InputError: {path}: unknown field 'num_block' (did you mean 'num_blocks'?)")


TINY_MODEL = {**MODEL_DATA, "hidden": 64, "feedforward": 256, "seq_size": 64, "attn_heads": 4, "attn_size": 16,
              "num_blocks": 2, "vocab_size": 1000}


def test_output_file_in_a_missing_directory_is_written_there(mapsat, write_file, tmp_path):
    # every output path's missing parent directories are created (--plot, --pareto, --out, --csv)
    model = str(write_file("tiny.yaml", TINY_MODEL))
    csv = tmp_path / "no-such-dir" / "deeper" / "all.csv"
    result = mapsat("brute", "--model", model, "--system", SYSTEM, "--gpus", "2", "--max-batch", "4",
                    "--workers", "1", "--csv", str(csv), "--json")
    assert result.exit_code == 0, result.output
    assert csv.read_text().count("\n") > 1


def test_output_file_under_a_file_is_one_line(mapsat, write_file, tmp_path):
    model = str(write_file("tiny.yaml", TINY_MODEL))
    blocker = write_file("not-a-dir", "a file where a directory would go")
    result = mapsat("brute", "--model", model, "--system", SYSTEM, "--gpus", "2", "--csv", str(blocker / "all.csv"))
    assert_problem_error(result, f"--csv {blocker}: cannot create the directory")


# ---- commands over files of their own: batch (a batch file), plot (a results directory),
# shape (parameter counts). Each case is run only when its command is registered.

def _write_batch(write_file, text: str) -> str:
    """A batch file; MODEL and SYSTEM stand for the shipped 1.3B model and H100 system."""
    return str(write_file("batch.yaml", text.replace("MODEL", MODEL).replace("SYSTEM", SYSTEM)))


BATCH_CASES = [
    ("malformed-yaml", "models: [MODEL\n", ["not valid YAML at line"]),
    ("empty", "", ["is empty"]),
    ("unknown-field", "modles: [MODEL]\nsystems: [SYSTEM]\ngpus: [8]\n",
     ["unknown field 'modles' (did you mean 'models'?)"]),
    ("missing-field", "systems: [SYSTEM]\ngpus: [8]\n", ["missing field 'models'"]),
    ("zero-gpus", "models: [MODEL]\nsystems: [SYSTEM]\ngpus: [0]\n", ["'gpus.0' 0"]),
    ("gpus-many", "models: [MODEL]\nsystems: [SYSTEM]\ngpus: [many]\n", ["'gpus.0' 'many'"]),
    ("model-file-missing", "models: [no-such-model.yaml]\nsystems: [SYSTEM]\ngpus: [8]\n",
     ["no-such-model.yaml: no such file"]),
    ("override-breaks-the-system", "models: [MODEL]\nsystems: [SYSTEM]\ngpus: [8]\noverrides: {nvlink_size: 100000}\n",
     ["--nvlink-size: 100000 is larger than the next network"]),
]


@pytest.mark.skipif("batch" not in cli.commands, reason="mapsat batch not installed")
@pytest.mark.parametrize("text, fragments", [pytest.param(*case[1:], id=case[0]) for case in BATCH_CASES])
def test_bad_batch_file(mapsat, write_file, tmp_path, text, fragments):
    result = mapsat("batch", _write_batch(write_file, text), "--out", str(tmp_path / "out"), "--quiet")
    assert_problem_error(result, *fragments)


@pytest.mark.skipif("batch" not in cli.commands, reason="mapsat batch not installed")
@pytest.mark.parametrize("args, fragments", [
    (["--jobs", "0"], ["'--jobs'", "0 is not in the range"]),
    (["--time-limit", "-1"], ["'--time-limit'"]),
], ids=["jobs-zero", "time-limit-negative"])
def test_bad_batch_option_is_a_usage_error(mapsat, write_file, tmp_path, args, fragments):
    path = _write_batch(write_file, "models: [MODEL]\nsystems: [SYSTEM]\ngpus: [8]\n")
    assert_usage_error(mapsat("batch", path, "--out", str(tmp_path / "out"), *args), *fragments)


@pytest.mark.skipif("batch" not in cli.commands, reason="mapsat batch not installed")
def test_batch_file_missing(mapsat, tmp_path):
    missing = tmp_path / "no-such-batch.yaml"
    assert_problem_error(mapsat("batch", str(missing), "--out", str(tmp_path / "out")), str(missing), "no such file")


@pytest.mark.skipif("plot" not in cli.commands, reason="mapsat plot not installed")
@pytest.mark.parametrize("make", ["missing", "empty"])
def test_plot_without_results(mapsat, tmp_path, make):
    directory = tmp_path / "runs"
    if make == "empty":
        directory.mkdir()
    assert_problem_error(mapsat("plot", str(directory)), str(directory))


@pytest.mark.skipif("plot" not in cli.commands, reason="mapsat plot not installed")
def test_plot_unknown_kind_is_a_usage_error(mapsat, tmp_path):
    assert_usage_error(mapsat("plot", str(tmp_path), "--kind", "pie"), "'--kind'", "'pie'")


@pytest.mark.skipif("shape" not in cli.commands, reason="mapsat shape not installed")
@pytest.mark.parametrize("args, fragments", [
    (["--params", "0"], ["'--params'", "0"]),
    (["--params", "many"], ["'--params'", "'many'"]),
    (["--params", "nan"], ["'--params'", "nan"]),
    (["--params", "1e12", "--gpus", "0"], ["'--gpus'", "0 is not in the range"]),
    (["--params", "1e12", "--gpus", "many"], ["'--gpus'", "'many'"]),
    (["--params", "1e12", "--blocks", "x"], ["'--blocks'", "'x'"]),
], ids=["params-zero", "params-many", "params-nan", "gpus-zero", "gpus-many", "blocks-not-numbers"])
def test_bad_shape_option_is_a_usage_error(mapsat, args, fragments):
    assert_usage_error(mapsat("shape", *args), *fragments)


@pytest.mark.skipif("shape" not in cli.commands, reason="mapsat shape not installed")
@pytest.mark.parametrize("case", ["malformed-system", "missing-system", "datatype-missing"])
def test_bad_shape_problem(mapsat, write_file, tmp_path, case):
    args = ["shape", "--params", "1e12", "--rule-only", "--gpus", "8", "--system"]
    if case == "malformed-system":
        path = str(write_file("system.yaml", "hbm: [\n"))
        result, fragments = mapsat(*args, path), [path, "not valid YAML"]
    elif case == "missing-system":
        path = str(tmp_path / "nope.yaml")
        result, fragments = mapsat(*args, path), [path, "no such file"]
    else:
        result, fragments = mapsat(*args, A100, "--datatype", "float8"), ["has no float8 compute"]
    assert_problem_error(result, *fragments)


@pytest.mark.parametrize("command", [name for name in ("brute", "solve") if name in PROBLEM_COMMANDS])
def test_impossible_problem_is_one_line(mapsat, command):
    # 175B parameters need ~3 TB of weights and optimizer state: 2 GPUs of 80 GiB cannot hold them.
    args = problem_args(command, model=str(MODELS_DIR / "gpt3-175b.yaml"))
    args[args.index("--gpus") + 1] = "2"
    assert_problem_error(mapsat(*args), "infeasible")
