"""The questions a new user asks, through the command line: overrides named in every header,
wrong-kind files named for what they look like, distinct top-k rows with their equivalent
settings, and `mapsat --help` that does not load the solver."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from solver.cli.app import cli

MODEL = "problems/models/gpt3-13b.yaml"
SYSTEM = "problems/systems/h100-80g-nvl8.yaml"
OVERRIDES = ["--hbm-gib", "40", "--nvlink-size", "4", "--offload-gib", "64", "--offload-gbps", "50"]
SMALL = ["--gpus", "4", "--max-batch", "4"]    # the header is the question, not the search (16 GPUs: 20M mappings)


@pytest.mark.parametrize("command", ["count", "brute", "solve", "explain"])
def test_every_header_names_the_overrides_and_pins(command):
    extra = {"brute": ["--workers", "1", "--top-k", "1"], "explain": ["--dims", "recompute"]}.get(command, [])
    result = CliRunner().invoke(cli, [command, "--model", MODEL, "--system", SYSTEM, *SMALL, *OVERRIDES,
                                      "--fix", "tp=2", *extra])
    assert result.exit_code == 0, result.output
    header = " ".join(result.output.split())
    assert "h100-80g-nvl8 (hbm 40 GiB, offload 64 GiB @ 50 GB/s, nvlink 4)" in header
    assert "fixed tp=2" in header


@pytest.mark.parametrize("given, looks_like", [("--model", "system"), ("--system", "model")])
def test_a_file_of_the_wrong_kind_says_what_it_looks_like(given, looks_like):
    files = {"--model": SYSTEM if looks_like == "system" else MODEL,
             "--system": MODEL if looks_like == "model" else SYSTEM}
    result = CliRunner().invoke(cli, ["count", "--model", files["--model"], "--system", files["--system"],
                                      "--gpus", "8"])
    assert result.exit_code == 1
    assert f"this looks like a {looks_like} file" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_top_k_rows_are_distinct_and_name_the_settings_they_cover():
    """At tp 1 the TP communication has no effect: one row covers its three values."""
    # 8 GPUs and batches up to 32: brute force scores a few hundred thousand mappings (64 GPUs: 25 s)
    args = ["--model", MODEL, "--system", SYSTEM, "--gpus", "8", "--max-batch", "32", "--top-k", "4", "--json"]
    solved = json.loads(CliRunner().invoke(cli, ["solve", *args]).output)
    brute = json.loads(CliRunner().invoke(cli, ["brute", *args, "--workers", "1"]).output)
    rows = [(r["mapping"], r["equivalent"]) for r in solved["top"]]
    assert len(rows) == 4
    keys = [tuple(r[0][f] for f in ("tensor_par", "pipeline_par", "pipeline_interleaving", "microbatch_size"))
            + (r[0]["activation_recompute"],) for r in rows]
    times = [r["iteration_time_s"] for r in solved["top"]]
    assert len(set(zip(keys, times))) == 4, "two rows of the same group"
    tp1 = [same for mapping, same in rows if mapping["tensor_par"] == 1]
    assert tp1 and all(same.get("tp_comm") == ["ar", "p2p_rs_ag", "rs_ag"] for same in tp1)
    assert [c["equivalent"] for c in brute["top"]] == [same for _, same in rows]
    assert [c["iteration_time_s"] for c in brute["top"]] == pytest.approx(times, rel=1e-9)


def test_help_does_not_load_the_solver():
    code = ("import sys; from solver.cli.app import main; sys.argv = ['mapsat', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED' if 'ortools' in sys.modules or 'pandas' in sys.modules else 'LIGHT')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("LIGHT")
