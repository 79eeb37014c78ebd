"""The `mapsat` command line through click's CliRunner: the group, its help and version, that
every command is documented with an example, and how the shared helpers turn bad input into
one-line errors with the right exit status."""

from __future__ import annotations

import re
from importlib.metadata import version

import click
import pytest
from click.testing import CliRunner

from conftest import H100_SYSTEM, MODELS_DIR, REPO
from costmodel.errors import InputError
from solver.cli import cli, load_problem, problem_options, user_errors

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
def _probe(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size):
    """Load a problem and print what was loaded."""
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size)
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
