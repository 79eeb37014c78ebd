"""DeepSeek-V3 laid out as its runs lay it: the layout rule's short last chunk against the
layouts Megatron-Bridge's recipes state (recipes/deepseek/h100/deepseek_v3.py,
set_deepseek_v3_pipeline_model_parallel_layout, and Kimi-K2's pp 2 × vp 8 on the same 16
virtual stages), read through Megatron-LM's layout strings; and `solve`, `plan` and
`explain` on DeepSeek-V3 with pp 16, ep 64, tp 1 on 2,048 H100s."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import H100_SYSTEM, MODELS_DIR
from costmodel.frameworks.bridge import export_bridge, import_bridge
from costmodel.frameworks.megatron import export_megatron, import_megatron
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.ops import ScalarOps
from costmodel.space.layout import end_chunk_blocks, layout_interleavings, layout_problem, stage_blocks
from costmodel.terms.pipeline_layout import layout_chunks, layout_string
from solver.cli.app import cli

DEEPSEEK_V3_BLOCKS = 61

# The recipe's layout_map, each list written as Megatron-LM's string (E the embedding, t a
# decoder, m the MTP module, L the loss), and Kimi-K2's (2, 8) entry (the same list as (16, 1))
RECIPE_LAYOUTS = {
    (4, 1): "Et*16|t*16|t*16|t*13mL",
    (8, 1): "Et*8|(t*8|)*6t*5mL",
    (4, 2): "Et*8|(t*8|)*6t*5mL",
    (16, 1): "Et*4|(t*4|)*14tmL",
    (8, 2): "Et*4|(t*4|)*14tmL",
    (4, 4): "Et*4|(t*4|)*14tmL",
    (2, 8): "Et*4|(t*4|)*14tmL",
}


def rule_chunks(num_blocks: int, pp: int, v: int) -> list[list[float]]:
    """Blocks per chunk of every rank as the layout rule lays them: full chunks but the last
    stage's last."""
    first, middle, last = stage_blocks(ScalarOps, float(num_blocks), float(pp), interleaving=float(v))
    chunk, _ = end_chunk_blocks(ScalarOps, float(num_blocks), float(pp), float(v))
    ranks = [[chunk] * v for _ in range(pp)]
    ranks[0] = [first - (v - 1) * chunk] + [chunk] * (v - 1)
    ranks[-1] = [chunk] * (v - 1) + [last - (v - 1) * chunk]
    assert pp < 3 or middle == v * chunk
    return ranks


@pytest.mark.parametrize("pp, v", sorted(RECIPE_LAYOUTS))
def test_the_rule_lays_deepseek_v3_out_as_the_recipes_do(pp, v):
    assert layout_problem(DEEPSEEK_V3_BLOCKS, pp, v) is None and v in layout_interleavings(DEEPSEEK_V3_BLOCKS, pp)
    assert rule_chunks(DEEPSEEK_V3_BLOCKS, pp, v) == layout_chunks(RECIPE_LAYOUTS[(pp, v)], pp, v)


@pytest.mark.parametrize("pp, v, stages", [
    (16, 1, (4, 4, 1)),          # 4, 4 × 14, 1: the MTP module and the loss beside one block
    (8, 1, (8, 8, 5)),
    (2, 8, (32, 29, 29)),        # no middle stage: `middle` is the lighter end's
    (4, 4, (16, 16, 13)),
])
def test_deepseek_v3_stage_blocks_by_hand(pp, v, stages):
    assert stage_blocks(ScalarOps, 61.0, float(pp), interleaving=float(v)) == stages


def test_a_pp_the_rule_cannot_lay_out_is_one_line_naming_the_numbers():
    # 32 stages of 2 blocks are 64: 3 too many for a last stage of 2
    reason = layout_problem(DEEPSEEK_V3_BLOCKS, 32, 1)
    assert reason is not None and "\n" not in reason
    assert "pipeline_par(32) divides neither num_blocks(61) nor num_blocks + 2 = 63" in reason
    assert layout_interleavings(DEEPSEEK_V3_BLOCKS, 32) == ()


DEEPSEEK_V3 = ["--model", str(MODELS_DIR / "deepseek-v3" / "config.json"), "--seq-size", "4096",
               "--system", str(H100_SYSTEM), "--quiet"]
FIXES = ["--fix", "pp=16", "--fix", "ep=64", "--fix", "tp=1"]


def test_solve_answers_deepseek_v3_on_16_stages_certified():
    """Issue #35: `--fix pp=16` on DeepSeek-V3 answered "does not divide num_blocks(61)"."""
    run = CliRunner().invoke(cli, ["solve", *DEEPSEEK_V3, "--gpus", "2048", *FIXES, "--json"])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.stdout)
    assert doc["status"] == "optimal" and doc["certified_optimal"]
    mapping = doc["top"][0]["mapping"]
    assert (mapping["pipeline_par"], mapping["expert_par"], mapping["tensor_par"]) == (16, 64, 1)
    assert doc["top"][0]["iteration_time_s"] > 0


def test_plan_takes_the_same_fixes():
    run = CliRunner().invoke(cli, ["plan", *DEEPSEEK_V3, "--gpus", "2048", "--tokens", "14.8e12", *FIXES, "--json"])
    assert run.exit_code == 0, run.output
    phase = json.loads(run.stdout)["counts"][0]["phases"][0]
    assert phase["certified_optimal"] and phase["mapping"]["pipeline_par"] == 16


@pytest.mark.slow
def test_explain_takes_the_same_fixes():
    run = CliRunner().invoke(cli, ["explain", *DEEPSEEK_V3, "--gpus", "2048", *FIXES, "--json"])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.stdout)
    assert '"pipeline_par": 16' in json.dumps(doc)


@pytest.mark.parametrize("pp, v", sorted(RECIPE_LAYOUTS))
def test_the_layout_string_written_is_the_recipes(pp, v):
    written = layout_string([[int(c) for c in rank] for rank in rule_chunks(DEEPSEEK_V3_BLOCKS, pp, v)], mtp_blocks=1)
    assert layout_chunks(written, pp, v) == layout_chunks(RECIPE_LAYOUTS[(pp, v)], pp, v)
    assert written.startswith("E") and written.endswith("mL") and written.count("E") == written.count("L") == 1


@pytest.mark.parametrize("export, parse", [(lambda m, model, system: export_megatron(m, model, lossy=True),
                                            import_megatron),
                                           (lambda m, model, system: export_bridge(m, model, system, lossy=True),
                                            import_bridge)])
def test_a_short_chunk_layout_is_exported_as_a_layout_string_and_read_back(export, parse):
    """pp 2 × vp 8: the first and last stage layer counts cannot say chunks of 4 with a last one
    of 1 (Megatron-LM asks v to divide them); the launch names the layout, and reads back as the
    same mapping."""
    model = load_model(MODELS_DIR / "deepseek-v3" / "config.json", seq_size=4096)
    system = load_system(H100_SYSTEM)
    mapping = Mapping(num_procs=2048, tensor_par=1, pipeline_par=2, pipeline_interleaving=8, data_par=1024,
                      expert_par=64, expert_tensor_par=1, batch_size=2048, microbatch_size=1, tensor_par_net=0,
                      pipeline_par_net=1, data_par_net=1, expert_par_net=1, expert_tensor_par_net=0)
    text = export(mapping, model, system).text
    assert "Et*4|t*4|" in text and text.count("t*4") == 15 and "|tmL" in text
    read = parse(text, model, system, "launch")
    assert (read.pp, read.pipeline_interleaving, read.pipeline_first_stage_blocks, read.pipeline_last_stage_blocks) == \
        (2, 8, None, None)
