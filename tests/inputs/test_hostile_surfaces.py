"""Hostile input on the newer surfaces (Hugging Face configs, mixture-of-experts options,
co-design grids), one family per mechanism, each family's cases generated rather than listed:

1. every number option of every command at NaN, infinity, negative, zero and huge values —
   an error raised anywhere in a command is one line (the group's handler);
2. every field a Hugging Face config.json reader uses, of every model_type, given a value of
   the wrong type — the typed schema names the field;
3. every boolean field of every input (model, system, mapping, config.json) given as a string
   or a number — refused, never read as bool(...); JSON booleans read as they are;
4. co-design grids past the caps — refused before any question; under them, a monotone knob
   is bisected;
5. messages: a pin no mapping can take names its dimension's rule, every error line is at
   most 300 characters, an alias bomb is called one only when it has aliases, output paths'
   missing directories are created.

Every refusal is checked the same way (`assert_refused`): exit 1 or 2, one error line of at
most 300 characters, no traceback. Problems are tiny so that an accepted value answers fast."""

from __future__ import annotations

import json
import math
import resource
import time
import types
import typing
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from conftest import H100_SYSTEM, MAPPING_DATA, MODEL_DATA, MODELS_DIR, SYSTEM_DATA
from costmodel.errors import InputError
from costmodel.inputs.hf import READERS
from costmodel.inputs.load import load_mapping, load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.system import Datatype, System
from solver.cli.app import COMMANDS, cli
from solver.cli.errors import MAX_ERROR_LINE
from solver.search import codesign as codesign_module
from solver.search.codesign import Grid, Target, codesign
from solver.search.codesign_grid import MAX_GRID_SYSTEMS, MAX_MODELS, least_reaching
from solver.search.solve import SolveStatus, solve
from solver.space.declaration import get_space

TINY = {**MODEL_DATA, "hidden": 64, "feedforward": 256, "seq_size": 64, "attn_heads": 4, "attn_size": 16,
        "num_blocks": 2, "vocab_size": 1000}
TINY_MOE = {**TINY, "num_experts": 4, "experts_per_token": 2, "expert_feedforward": 128}


def mapsat(*args) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="mapsat")


def assert_refused(result, *fragments: str) -> str:
    """Exit 1 (`error: ...` on stderr) or 2 (click's `Error: ...`): one error line of at most
    MAX_ERROR_LINE characters holding every fragment, and no traceback."""
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, repr(result.exception)
    assert result.exit_code in (1, 2), f"exit {result.exit_code}: {result.output}"
    assert "Traceback" not in result.output
    prefix = "error: " if result.exit_code == 1 else "Error: "
    lines = [line for line in result.output.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, result.output
    assert len(lines[0]) <= MAX_ERROR_LINE, f"{len(lines[0])} characters: {lines[0]}"
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def assert_answers_or_refuses(result) -> None:
    if result.exit_code != 0:
        assert_refused(result)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("hostile")
    out = {}
    for name, data in (("model", TINY), ("moe", TINY_MOE), ("system", SYSTEM_DATA)):
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(data))
        out[name] = str(directory / f"{name}.yaml")
    mapping = {**MAPPING_DATA, "num_procs": 2, "tensor_par": 1, "pipeline_par": 1, "data_par": 2, "batch_size": 4,
               "microbatch_size": 1}
    (directory / "mapping.json").write_text(json.dumps(mapping))
    out["mapping"] = str(directory / "mapping.json")
    out["dir"] = str(directory)
    return out


# ---------------------------------------------------------------- 1. number options

HOSTILE_NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e308", str(2**63), str(2**64), "9" * 5000]


def base_args(command: str, files: dict[str, str], model: str = "moe") -> list[str]:
    """A tiny problem each command answers in about a second (a mixture of experts, or the
    dense `model`); the option under test is added."""
    problem = ["--model", files[model], "--system", files["system"]]
    return {
        "solve": [*problem, "--gpus", "2", "--time-limit", "5"],
        "brute": [*problem, "--gpus", "2", "--workers", "1"],
        "count": [*problem, "--gpus", "2"],
        "explain": [*problem, "--gpus", "2", "--time-limit", "5", "--dims", "tp"],
        "codesign": [*problem, "--gpus", "2", "--within", "0.1", "--vary", "hbm_gib=40,80", "--time-limit", "5"],
        "eval": [*problem, "--mapping", files["mapping"]],
        "plan": [*problem, "--gpus", "2", "--tokens", "1e9", "--time-limit", "5"],
        "shape": ["--params", "1e9", "--gpus", "8", "--blocks", "2,4", "--rule-only"],
        "batch": [str(Path(files["dir"]) / "batch.yaml"), "--out", str(Path(files["dir"]) / "batch-out")],
    }[command]


NUMBER_OPTIONS = [(name, param.opts[0]) for name in COMMANDS for param in cli.commands[name].params
                  if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType))]


def test_number_options_are_found():
    assert {("solve", "--capacity-factor"), ("brute", "--batch-tokens"), ("codesign", "--target-mfu"),
            ("shape", "--params"), ("batch", "--jobs")} <= set(NUMBER_OPTIONS)


@pytest.mark.parametrize("command, option", NUMBER_OPTIONS, ids=[f"{c}{o}" for c, o in NUMBER_OPTIONS])
def test_every_number_option_at_hostile_values_answers_or_is_one_line(files, command, option):
    if command == "batch":   # a batch file that runs nothing: the option is what is under test
        Path(files["dir"], "batch.yaml").write_text(f"models: [{files['model']}]\nsystems: [{files['system']}]\n"
                                                    f"gpus: [3]\n")
    args = base_args(command, files)
    for value in HOSTILE_NUMBERS:
        with_value = list(args)
        if option in with_value:
            with_value[with_value.index(option) + 1] = value
        else:
            with_value += [option, value]
        started = time.perf_counter()
        result = mapsat(command, *with_value)
        assert_answers_or_refuses(result)
        if result.exit_code:
            assert time.perf_counter() - started < 10, (command, option, value)


@pytest.mark.parametrize("tokens", [2**40, 2**25 * 64, 10**18])
def test_a_batch_in_tokens_past_the_search_bound_is_refused_before_any_search(files, tokens):
    for command in ("solve", "brute", "explain"):
        started = time.perf_counter()
        result = mapsat(command, *base_args(command, files), "--batch-tokens", tokens)
        assert_refused(result, f"--batch-tokens {tokens}", "sequences of seq_size 64 tokens", "above 2^24")
        assert time.perf_counter() - started < 5
    assert mapsat("count", *base_args("count", files), "--batch-tokens", 2**40, "--json").exit_code == 0


def test_capacity_factor_below_one_is_one_line_on_the_mixtral_config():
    result = mapsat("solve", "--model", MODELS_DIR / "mixtral-8x7b" / "config.json", "--seq-size", 4096,
                    "--system", H100_SYSTEM, "--gpus", 16, "--capacity-factor", 0.5)
    assert_refused(result, "'--capacity-factor'", "0.5 is below 1")


def test_an_error_raised_by_an_option_wrapper_is_one_line_and_debug_shows_it(files, monkeypatch):
    from costmodel.inputs.kernels import Kernels

    def refuse(*args, **kwargs):
        raise InputError("attention 'x' does not exist")

    monkeypatch.setattr(Kernels, "with_attention", staticmethod(refuse))
    assert_refused(mapsat("count", *base_args("count", files)), "attention 'x' does not exist")
    debug = mapsat("--debug", "count", *base_args("count", files))
    assert isinstance(debug.exception, InputError)


# ---------------------------------------------------------------- 2. Hugging Face fields

def _shipped(name: str) -> dict:
    return json.loads((MODELS_DIR / name / "config.json").read_text())


VALID_CONFIGS = {
    "llama": _shipped("llama-3.1-8b"), "mistral": _shipped("mistral-7b"), "qwen2": _shipped("qwen2.5-72b"),
    "mixtral": _shipped("mixtral-8x7b"), "qwen2_moe": _shipped("qwen1.5-moe-a2.7b"),
    "qwen3_moe": _shipped("qwen3-30b-a3b"), "nemotron": _shipped("nemotron-4-340b"), "qwen3": _shipped("qwen3-8b"),
    "deepseek_v3": _shipped("deepseek-v3"), "gpt_oss": _shipped("gpt-oss-20b"),
    "nemotron_h": _shipped("nemotron-h-8b"), "gemma3_text": _shipped("gemma-3-27b"),
    "llama4_text": _shipped("llama-4-scout"),
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
             "n_positions": 1024},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
                 "intermediate_size": 24576, "vocab_size": 50432, "use_parallel_residual": True},
}

WRONG = {  # values of the wrong type (or out of range) for each kind of field
    "number": ["4096", "many", [8], {"n": 8}, True, 1.5, -1, 0.5, 10**30, math.nan],
    "boolean": ["false", "true", "yes", "", 0, 1, [True], {"b": True}],
    "text": [["silu"], 1, True, {"act": "silu"}, 2.5],
    "list": ["none", 5, [True], ["0"], [-1], [1.5], {"0": 1}],
    # dropout probabilities (a real number's text, "0.1", reads as the number, as everywhere: YAML 1.1
    # reads 1e-5 as a string)
    "fraction": ["none", [0.1], {"p": 0.1}, True, -0.5, 1.5, math.nan],
}


def field_kind(annotation) -> str:
    text = repr(annotation)
    if "list[" in text:
        return "list"
    if "bool" in text:
        return "boolean"
    if "int" in text:
        return "number"
    if "float" in text:
        return "fraction"
    return "text"


HF_FIELDS = [(kind, name, field_kind(info.annotation)) for kind, (schema, _) in READERS.items()
             for name, info in schema.model_fields.items() if name != "model_type"]


def test_every_model_type_has_a_valid_config_here():
    assert set(VALID_CONFIGS) == set(READERS)
    for kind, config in VALID_CONFIGS.items():
        assert config["model_type"] == kind


def _write_config(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("kind, field, field_type", HF_FIELDS, ids=[f"{k}.{f}" for k, f, _ in HF_FIELDS])
def test_every_config_field_of_the_wrong_type_is_named(tmp_path, kind, field, field_type):
    for wrong in WRONG[field_type]:
        path = _write_config(tmp_path, {**VALID_CONFIGS[kind], field: wrong})
        with pytest.raises(InputError) as raised:
            load_model(path, seq_size=1024)
        message = str(raised.value)
        assert f"'{field}" in message and str(path) in message and "\n" not in message, (wrong, message)
    # and through the command line: one line, the field named, no traceback
    path = _write_config(tmp_path, {**VALID_CONFIGS[kind], field: WRONG[field_type][0]})
    assert_refused(mapsat("count", "--model", path, "--seq-size", 1024, "--system", H100_SYSTEM, "--gpus", 8),
                   f"'{field}")


@pytest.mark.parametrize("wrong", [["llama"], 7, None, {"type": "llama"}, "llama " * 100])
def test_a_model_type_of_the_wrong_type_is_named(tmp_path, wrong):
    path = _write_config(tmp_path, {**VALID_CONFIGS["llama"], "model_type": wrong})
    assert_refused(mapsat("count", "--model", path, "--seq-size", 1024, "--system", H100_SYSTEM, "--gpus", 8),
                   "model_type", "is not supported")


@pytest.mark.parametrize("field, value, fragments", [
    ("hidden_size", "4096", ["field 'hidden_size' '4096'", "a string, not a whole number"]),
    ("num_attention_heads", 0, ["field 'num_attention_heads' 0", "below 1"]),
    ("hidden_act", ["silu"], ["field 'hidden_act'", "valid string"]),
])
def test_the_reported_config_values_name_their_field(tmp_path, field, value, fragments):
    path = _write_config(tmp_path, {**VALID_CONFIGS["llama"], field: value})
    assert_refused(mapsat("solve", "--model", path, "--seq-size", 4096, "--system", H100_SYSTEM, "--gpus", 8),
                   *fragments)


def test_a_null_field_is_its_default_as_in_transformers(tmp_path):
    config = {**VALID_CONFIGS["mistral"], "head_dim": None, "sliding_window": None, "num_key_value_heads": None}
    model = load_model(_write_config(tmp_path, config), seq_size=4096)
    assert (model.attn_size, model.kv_heads) == (4096 // 32, 32)


# ---------------------------------------------------------------- 3. booleans

def _boolean_fields(schema, prefix: str = "") -> list[str]:
    """Dotted paths of the bool fields of a pydantic schema, descending into nested schemas
    and into the first item of a list of them (the fields under a dict key are not reached)."""
    out = []
    for name, info in schema.model_fields.items():
        if field_kind(info.annotation) == "boolean":
            out.append(prefix + name)
        annotation = info.annotation
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        for alt in typing.get_args(annotation) if union else (annotation,):
            item = typing.get_args(alt)[0] if typing.get_origin(alt) is list else None
            if isinstance(alt, type) and issubclass(alt, BaseModel):
                out += _boolean_fields(alt, f"{prefix}{name}.")
            elif isinstance(item, type) and issubclass(item, BaseModel):
                out += _boolean_fields(item, f"{prefix}{name}.0.")
    return out


INPUT_BOOLEANS = ([("model", f) for f in _boolean_fields(Model)] + [("mapping", f) for f in _boolean_fields(Mapping)]
                  + [("system", f) for f in _boolean_fields(System)])


def test_the_boolean_fields_are_found():
    assert {("model", "tied_embeddings"), ("model", "bias"), ("mapping", "weight_offload"),
            ("mapping", "fused_attention"), ("mapping", "seq_par_ag_redo"),
            ("system", "networks.0.must_be_filled")} <= set(INPUT_BOOLEANS)


def _set(data: dict, path: str, value) -> dict:
    data = json.loads(json.dumps(data))
    holder = data
    *parents, last = path.split(".")
    for part in parents:
        holder = holder[int(part)] if part.isdigit() else holder[part]
    holder[last] = value
    return data


@pytest.mark.parametrize("kind, field", INPUT_BOOLEANS, ids=[f"{k}.{f}" for k, f in INPUT_BOOLEANS])
def test_every_input_boolean_given_as_a_string_or_number_is_refused(tmp_path, kind, field):
    # (a system with a whole-step section)
    base = {"model": MODEL_DATA, "mapping": MAPPING_DATA,
            "system": {**SYSTEM_DATA, "step": {"kernel_gap_us": 0, "power_window_ms": 5}}}[kind]
    if field.startswith("mamba."):     # a hybrid model's Mamba-2 shape: Nemotron-H 8B as this project writes it
        base = load_model(MODELS_DIR / "nemotron-h-8b" / "config.json", seq_size=4096).model_dump(mode="json")
    load = {"model": load_model, "mapping": load_mapping, "system": load_system}[kind]
    for wrong in WRONG["boolean"]:
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(_set(base, field, wrong)))
        with pytest.raises(InputError) as raised:
            load(path)
        assert f"field '{field}" in str(raised.value), (wrong, str(raised.value))


@pytest.mark.parametrize("field", ["tie_word_embeddings", "attention_bias", "mlp_bias"])
def test_config_booleans_are_read_as_they_are_and_strings_refused(tmp_path, field):
    for value in (True, False):
        config = {**VALID_CONFIGS["llama"], field: value}
        if field != "tie_word_embeddings":    # llama's biases are all on or all off
            config.update(attention_bias=value, mlp_bias=value)
        model = load_model(_write_config(tmp_path, config), seq_size=4096)
        assert (model.tied_embeddings if field == "tie_word_embeddings" else model.bias) is value
    for text in ("false", "true"):
        with pytest.raises(InputError, match=f"field '{field}' '{text}': a string, not a valid boolean"):
            load_model(_write_config(tmp_path, {**VALID_CONFIGS["llama"], field: text}), seq_size=4096)


def test_use_parallel_residual_as_a_string_is_refused_not_warned_about(tmp_path):
    config = {**VALID_CONFIGS["gpt_neox"], "use_parallel_residual": "false"}
    assert_refused(mapsat("count", "--model", _write_config(tmp_path, config), "--seq-size", 2048,
                          "--system", H100_SYSTEM, "--gpus", 8), "field 'use_parallel_residual' 'false'")


@pytest.mark.parametrize("kind, field", [("mapping", "capacity_factor"), ("batch", "capacity_factor"),
                                         ("batch", "time_limit_s"), ("batch", "overrides.hbm_gib"),
                                         ("batch", "overrides.offload_gbps")])
def test_a_boolean_where_a_number_goes_is_refused_too(files, tmp_path, kind, field):
    # the other side of bool(...): `true` is not read as 1.0
    if kind == "mapping":
        path = tmp_path / "mapping.json"
        path.write_text(json.dumps({**MAPPING_DATA, field: True}))
        with pytest.raises(InputError, match=f"field '{field}' True: a boolean, not a number"):
            load_mapping(path)
        return
    from solver.study.batch import load_batch

    doc = _set({"models": [files["model"]], "systems": [files["system"]], "gpus": [2], "overrides": {}}, field, True)
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=f"field '{field}"):
        load_batch(path)


MAPPING_NUMBERS = [name for name, info in Mapping.model_fields.items()
                   if field_kind(info.annotation) == "number" and name in MAPPING_DATA] + ["sharding_stage"]


@pytest.mark.parametrize("field", MAPPING_NUMBERS)
def test_every_mapping_number_written_as_text_is_refused_alike(tmp_path, field):
    # sharding_stage "3" as context_par "2": a number is written without quotes
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps({**MAPPING_DATA, field: str(MAPPING_DATA.get(field, 1))}))
    with pytest.raises(InputError, match=f"field '{field}' '[0-9]+': a string, not a whole number"):
        load_mapping(path)


# ---------------------------------------------------------------- 4. co-design grids

KNOB_VALUES = {"hbm_gib": lambda n: [40 + i for i in range(n)], "offload_gib": lambda n: [8 * i for i in range(n)],
               "offload_gbps": lambda n: [10 + i for i in range(n)], "nvlink_size": lambda n: [1 + i for i in range(n)]}


@st.composite
def grids_past_a_cap(draw) -> dict[str, int]:
    """Value counts per knob whose grid is past MAX_GRID_SYSTEMS systems or MAX_MODELS models."""
    knobs = draw(st.lists(st.sampled_from(list(KNOB_VALUES)), min_size=1, max_size=4, unique=True))
    outer = [k for k in knobs if k in ("offload_gbps", "nvlink_size")]
    if outer and draw(st.booleans()):            # past the models cap
        counts = {k: 1 for k in knobs}
        counts[outer[0]] = draw(st.integers(MAX_MODELS + 1, 3000))
        return counts
    counts = {k: draw(st.integers(1, 120)) for k in knobs}
    counts[knobs[0]] = MAX_GRID_SYSTEMS // math.prod(n for k, n in counts.items() if k != knobs[0]) + 1
    return counts


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(counts=grids_past_a_cap())
def test_a_grid_past_a_cap_is_refused_before_any_question(files, counts):
    vary = [a for knob, n in counts.items() for a in ("--vary", f"{knob}=" + ",".join(map(str, KNOB_VALUES[knob](n))))]
    started = time.perf_counter()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = mapsat("codesign", "--model", files["model"], "--system", files["system"], "--gpus", 2,
                    "--within", "0.1", *vary)
    assert_refused(result, "--vary:", f"more than {MAX_GRID_SYSTEMS:,}" if math.prod(counts.values()) >
                   MAX_GRID_SYSTEMS else f"more than {MAX_MODELS}")
    assert time.perf_counter() - started < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 1 << 20   # KiB: under 1 GiB


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(n=st.integers(0, 3000), answer=st.integers(0, 3000))
def test_bisection_equals_the_scan_and_proves_every_smaller_value(n, answer):
    values = tuple(float(v) for v in range(n))
    asked = []

    def reaches_at(value: float) -> bool:      # monotone: reaches from `answer` on
        asked.append(value)
        return value >= answer

    found = least_reaching(values, reaches_at, monotone=True)
    assert found == next((v for v in values if v >= answer), None)
    assert len(asked) <= max(1, math.ceil(math.log2(n + 1)))
    below = found - 1 if found is not None else (values[-1] if values else None)
    if below is not None and below >= 0:       # the value just below the answer was asked and missed
        assert below in asked


CODESIGN_MODEL = Model(name="m", hidden=256, feedforward=1024, seq_size=256, attn_heads=8, attn_size=32, num_blocks=4)


def test_a_long_capacity_grid_asks_logarithmically_many_questions():
    system = load_system(H100_SYSTEM).with_overrides(runtime_reserve_gib=0)
    space = get_space("full")
    values = tuple(2.0**-10 * 1.05**i for i in range(300))       # 1 MiB up to 2 GiB of HBM
    result = codesign(CODESIGN_MODEL, system, 4, Grid.build({"hbm_gib": values}), Target("within", 0.5),
                      max_batch=8, space=space)
    assert result.system is not None and result.certified_optimal
    assert result.questions <= math.ceil(math.log2(len(values))) + 2
    least = values.index(result.system["hbm_gib"])
    assert least > 0 and len(result.proof) == least
    # the answer reaches and the value below it misses, by solve itself
    for index, reach in ((least, True), (least - 1, False)):
        best = solve(CODESIGN_MODEL, system.with_overrides(hbm_gib=values[index]), 4, max_batch=8, space=space).best
        assert (best is not None and best.iteration_time_s <= result.target_time_s * (1 + 1e-9)) is reach


def test_the_answer_does_not_depend_on_how_many_models_are_kept(monkeypatch):
    system = load_system(H100_SYSTEM).with_overrides(runtime_reserve_gib=0)
    grid = Grid.build({"hbm_gib": (0.01, 0.05, 1.0), "nvlink_size": (1, 2)}, ("hbm_gib",))
    args = dict(max_batch=4, datatype=Datatype.bfloat16, space=get_space("full"))
    kept = codesign(CODESIGN_MODEL, system, 2, grid, Target("within", 0.2), **args)
    monkeypatch.setattr(codesign_module, "LIVE_MODELS", 1)    # every new outer combination rebuilds
    rebuilt = codesign(CODESIGN_MODEL, system, 2, grid, Target("within", 0.2), **args)
    assert (rebuilt.system, rebuilt.questions) == (kept.system, kept.questions)
    assert [v.to_dict() for v in rebuilt.proof] == [v.to_dict() for v in kept.proof]


# ---------------------------------------------------------------- 5. messages

def _unreachable_pins(model: dict, system: dict, gpus: int) -> list[tuple[str, str]]:
    """(pin, what the message must name) for values no mapping of the problem can take, from
    the declaration: networks past the system's, offload without offload memory, expert
    parallelism on a dense model, degrees that do not divide the GPUs."""
    networks = len(system["networks"])
    pins = [(f"{dim}={networks + extra}", f"network {networks + extra} does not exist")
            for dim in ("tp_net", "cp_net", "ep_net", "pp_net", "dp_net") for extra in (0, 7)]
    pins += [(f"{flag}=on", "has no offload memory")
             for flag in ("weight_offload", "activations_offload", "optimizer_offload")]
    if not model.get("num_experts"):
        pins += [("ep=2", "needs a mixture-of-experts model")]
    pins += [(f"{dim}={gpus * 3}", f"does not divide the {gpus} GPUs") for dim in ("tp", "cp", "pp", "dp")]
    return pins


PINS = _unreachable_pins(TINY, SYSTEM_DATA, 2)


@pytest.mark.parametrize("pin, reason", PINS, ids=[p for p, _ in PINS])
def test_a_pin_no_mapping_can_take_names_its_cause(files, pin, reason):
    for command in ("count", "solve"):
        line = assert_refused(mapsat(command, *base_args(command, files, model="model"), "--fix", pin),
                              f"--fix {pin.split('=')[0]}", reason)
        assert "divisibility rules" not in line


@pytest.mark.parametrize("args", [("--fix", "batch=3", "--batch", "4"), ("--fix", "batch=4", "--batch-tokens", "256")])
def test_a_batch_fixed_twice_is_refused_not_settled_silently(files, args):
    assert_refused(mapsat("count", *base_args("count", files), *args), "--fix: batch is fixed twice")


def test_a_batch_pin_one_problem_cannot_take_is_that_problems_error_only(files, tmp_path):
    from solver.study.batch import load_batch
    from solver.study.runner import solve_payload

    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump({"models": [{**TINY, "name": "dense"}, {**TINY_MOE, "name": "moe"}],
                                    "systems": [files["system"]], "gpus": [2], "max_batch": [4],
                                    "fix": {"ep": 2}, "time_limit_s": 10}))
    records = {p.model.name: solve_payload(p.payload()) for p in load_batch(path)}
    assert records["dense"]["status"] == "error"
    assert records["dense"]["error"].startswith("fix ep=2: expert_par(2) needs a mixture-of-experts model")
    assert records["moe"]["status"] == "optimal" and records["moe"]["best"]["mapping"]["expert_par"] == 2


def test_a_batch_files_unknown_fix_dimension_reads_once(files, tmp_path):
    path = tmp_path / "batch.yaml"
    path.write_text(f"models: [{files['model']}]\nsystems: [{files['system']}]\ngpus: [2]\nfix: {{tpx: 2}}\n")
    line = assert_refused(mapsat("batch", path, "--out", tmp_path / "out"), f"{path}: fix: 'tpx' is not a dimension")
    assert ": :" not in line


@pytest.mark.parametrize("make", [
    lambda d: ("--model", _long_model(d)),
    lambda d: ("--fix", "tp=" + "9" * 5000),
    lambda d: ("--fix", "recompute=" + ",".join(["most"] * 3000)),
    lambda d: ("--model", str(Path(d) / ("x" * 200) / ("y" * 200) / "model.yaml")),
    lambda d: ("--system", _long_mlp_only_layers(d)),
    lambda d: ("--model", _written(d, "digits.json", '{"hidden": ' + "9" * 5000 + "}")),
    lambda d: ("--model", _written(d, "digits.yaml", "hidden: " + "9" * 5000 + "\n")),
], ids=["long-field-value", "long-number", "long-choice", "long-path", "model-as-system", "json-digits",
        "yaml-digits"])
def test_every_error_line_is_at_most_300_characters(files, make):
    option, value = make(files["dir"])
    args = {"--model": files["moe"], "--system": files["system"]}
    args[option] = value if option in args else args.get(option)
    extra = [option, value] if option not in ("--model", "--system") else []
    assert_refused(mapsat("count", "--model", args["--model"], "--system", args["--system"], "--gpus", 2, *extra))


def _written(directory: str, name: str, text: str) -> str:
    path = Path(directory) / name
    path.write_text(text)
    return str(path)


def _long_model(directory: str) -> str:
    path = Path(directory) / "long.yaml"
    path.write_text(yaml.safe_dump({**TINY, "name": "n" * 10_000, "hidden": "h" * 10_000}))
    return str(path)


def _long_mlp_only_layers(directory: str) -> str:
    path = Path(directory) / "qwen" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**VALID_CONFIGS["qwen2_moe"], "mlp_only_layers": list(range(100_000))}))
    return str(path)


def test_a_config_listing_100000_dense_layers_is_one_short_line(files):
    result = mapsat("count", "--model", _long_mlp_only_layers(files["dir"]), "--seq-size", 2048,
                    "--system", H100_SYSTEM, "--gpus", 8)
    assert_refused(result, "mlp_only_layers", "past the last layer (23")


def test_a_large_document_is_called_an_alias_bomb_only_with_aliases(files, tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"models: [{files['model']}]\nsystems: [{files['system']}]\n"
                     f"gpus: [{', '.join(['2'] * 100_001)}]\n")
    line = assert_refused(mapsat("batch", plain, "--out", tmp_path / "out"), "holds more than 100,000 values")
    assert "alias" not in line and not (tmp_path / "out").exists()
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + "".join(
        f"b{i}: &b{i} [" + ", ".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 10) + "]\n" for i in range(5)))
    assert_refused(mapsat("batch", bomb, "--out", tmp_path / "out"), "alias bomb")


def test_every_output_path_gets_its_missing_directories(files, tmp_path):
    problems = Path(__file__).resolve().parents[2] / "problems"
    runs = {
        "--csv": ["brute", *base_args("brute", files), "--csv"],
        "--plot": ["explain", *base_args("explain", files), "--plot"],
        "--pareto": ["codesign", *base_args("codesign", files), "--pareto"],
        "--out": ["calibrate", "--base", problems / "systems/calibration/h100-80g-nvl8.base.yaml",
                  "--measurements", problems / "measurements/h100-sxm-80g", "--out"],
    }
    for option, args in runs.items():
        path = tmp_path / option.strip("-") / "not" / "yet" / "there.png"
        result = mapsat(*args, path)
        assert result.exit_code == 0, result.output
        assert path.is_file(), (option, result.output)


@pytest.mark.parametrize("command, option", [("explain", "--plot"), ("codesign", "--pareto")])
def test_an_image_format_matplotlib_cannot_write_is_refused_before_the_search(files, tmp_path, command, option):
    path = tmp_path / "figure.out"
    started = time.perf_counter()
    assert_refused(mapsat(command, *base_args(command, files), option, path),
                   f"{option} {path}: matplotlib does not write .out files")
    assert time.perf_counter() - started < 5


# ---------------------------------------------------------------- 6. silent wrong answers

@pytest.mark.parametrize("dense", [62, 61, 1000])
def test_first_k_dense_replace_at_or_past_the_layers_is_refused(tmp_path, dense):
    path = _write_config(tmp_path, {**VALID_CONFIGS["deepseek_v3"], "first_k_dense_replace": dense})
    assert_refused(mapsat("solve", "--model", path, "--seq-size", 4096, "--system", H100_SYSTEM, "--gpus", 64),
                   f"first_k_dense_replace {dense} with num_hidden_layers 61", "no block would have experts")


def test_first_dense_blocks_past_num_blocks_is_refused(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump({**TINY_MOE, "first_dense_blocks": 5}))
    for command in ("count", "solve", "plan"):
        extra = ["--tokens", "1e9"] if command == "plan" else []
        assert_refused(mapsat(command, "--model", path, "--system", H100_SYSTEM, "--gpus", 2, *extra),
                       "first_dense_blocks(5) > num_blocks(2)")


@pytest.mark.parametrize("field, value, check", [
    ("first_k_dense_replace", 0, lambda m: m.moe_blocks == m.num_blocks == 61),
    ("num_nextn_predict_layers", 0, lambda m: m.mtp_blocks == 0),
])
def test_zero_dense_blocks_and_zero_prediction_modules_are_legal(tmp_path, field, value, check):
    model = load_model(_write_config(tmp_path, {**VALID_CONFIGS["deepseek_v3"], field: value}), seq_size=4096)
    assert check(model)


@pytest.mark.parametrize("extreme", [("--failure-rate", "1"), ("--restart-minutes", "1e6")])
def test_a_plan_whose_goodput_is_zero_is_refused_not_inf_days(files, extreme):
    # 8 GPUs at a failure an hour each: an interruption every 7.5 minutes, shorter than a 10-minute restart
    args = ["--model", files["model"], "--system", files["system"], "--gpus", "8,16", "--tokens", "1e9",
            "--failure-rate", "1" if extreme[0] == "--failure-rate" else "1e-3", *extreme]
    line = assert_refused(mapsat("plan", *args), "no GPU count can train", "goodput 0", "--restart-minutes")
    assert "inf" not in line
    document = json.loads(CliRunner().invoke(cli, ["plan", *args, "--json"]).stdout)
    assert document["chosen"] is None and not any(row["feasible"] for row in document["counts"])
    assert all("goodput 0" in row["reason"] for row in document["counts"])


@st.composite
def model_documents(draw) -> dict:
    """Model files over the fields that must agree: the MoE block counts (first_dense_blocks,
    moe_every, experts), latent attention, sliding windows and prediction modules, at their
    edges (0, 1, the block count, past it)."""
    blocks = draw(st.integers(1, 6))
    edge = st.sampled_from([0, 1, blocks - 1, blocks, blocks + 1, 2 * blocks + 3])
    doc = {**TINY, "num_blocks": blocks, "mlp": draw(st.sampled_from(["gelu", "swiglu", "squared_relu"])),
           "mtp_blocks": draw(edge), "qk_norm": draw(st.booleans()), "attention_sinks": draw(st.booleans())}
    if draw(st.booleans()):
        experts = draw(st.sampled_from([1, 4, 16]))
        doc.update(num_experts=experts, experts_per_token=draw(st.integers(1, experts)), expert_feedforward=32,
                   first_dense_blocks=draw(edge),
                   moe_every=draw(st.integers(1, blocks + 2)), router_bias=draw(st.booleans()),
                   router_load_balancing=draw(st.sampled_from(["none", "aux_loss", "seq_aux_loss", "global_aux_loss"])),
                   router_fp32=draw(st.booleans()), router_expert_bias=draw(st.booleans()))
        shared = draw(st.integers(0, 2))
        doc.update(shared_experts=shared, shared_expert_feedforward=32 * bool(shared))
    if draw(st.booleans()):
        doc.update(sliding_window=draw(st.sampled_from([16, 128])),
                   sliding_window_blocks=draw(st.one_of(st.none(), edge)))
    if draw(st.booleans()):
        doc.update(bias=False, latent_attention={"q_lora_rank": draw(st.sampled_from([0, 8])), "kv_lora_rank": 8,
                                                 "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16})
    return doc


ONE_GPU = {**MAPPING_DATA, "num_procs": 1, "tensor_par": 1, "pipeline_par": 1, "data_par": 1, "batch_size": 2,
           "microbatch_size": 1}


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(doc=model_documents())
def test_no_accepted_model_answers_a_negative_or_non_finite_figure(doc):
    """A model the schema accepts has positive parameter counts, block counts that add up,
    and a mapping of it a positive, finite time, MFU in (0, 1] and a finite day count; one
    it refuses is refused with one line."""
    from costmodel.evaluate import evaluate
    from costmodel.inputs.load import parse
    from costmodel.terms.param_counts import ParameterCounts
    from costmodel.terms.training_cost import failures, run_cost

    try:
        model = parse(Model, doc, "model.yaml")
    except InputError as err:
        assert "\n" not in str(err) and len(str(err)) <= MAX_ERROR_LINE
        return
    assert 0 <= model.moe_blocks <= model.num_blocks and model.dense_blocks >= 0
    assert bool(model.num_experts) <= (model.moe_blocks > 0)
    counts = ParameterCounts.of(model)
    assert all(value >= 0 and math.isfinite(value) for value in counts.to_dict().values())
    assert counts.total > 0 and 0 < counts.active <= counts.total
    ev = evaluate(model, load_system_data(), Mapping(**ONE_GPU))
    assert math.isfinite(ev.iteration_time_s) and ev.iteration_time_s > 0
    assert 0 < ev.mfu <= 1 and all(math.isfinite(t) and t >= 0 for t in ev.time.as_dict().values())
    cost = run_cost(1, 1e6 * ev.iteration_time_s, failures(1, counts.total * 16.0))
    assert math.isfinite(cost.wall_days) and cost.wall_days > 0


def load_system_data() -> System:
    from costmodel.inputs.load import parse

    return parse(System, SYSTEM_DATA, "system.yaml")


# ---------------------------------------------------------------- 7. unbounded work

@pytest.mark.parametrize("args, fragment", [
    (["--gpus", "8-1000000:8"], "--gpus 8-1000000:8: 125,000 GPU counts, more than 256"),
    (["--gpus", "8-16777216"], "2,097,152 GPU counts, more than 256"),
    (["--max-gpus", "16777216"], "--max-gpus 8-16777216:8: 2,097,152 GPU counts"),
    (["--gpus", "8-99999999999:8"], "above 2^24"),
])
def test_a_plan_over_too_many_counts_is_refused_before_any_solve(files, args, fragment):
    started = time.perf_counter()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert_refused(mapsat("plan", "--model", files["model"], "--system", files["system"], *args, "--tokens", "1e9"),
                   fragment)
    assert time.perf_counter() - started < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100_000     # KiB


def test_brute_proves_infeasibility_from_the_network_sizes_before_scoring(files, monkeypatch):
    """As `solve`: 4,096 GPUs on networks of 8 and 16 leave no split whose groups span a
    network; the proof comes before any mapping is scored (the threshold lowered to this space)."""
    from solver.search import brute as brute_module

    monkeypatch.setattr(brute_module, "PROOF_ROWS", 0)
    small = tmp_system(files, [{**SYSTEM_DATA["networks"][0]}, {**SYSTEM_DATA["networks"][1], "size": 16}])
    result = mapsat("brute", "--model", files["model"], "--system", small, "--gpus", 4096, "--workers", 1)
    line = assert_refused(result, "infeasible, proven before scoring", "network size: no split of 4096 GPUs")
    solved = mapsat("solve", "--model", files["model"], "--system", small, "--gpus", 4096, "--json")
    assert solved.exit_code == 1 and "network size" in line
    document = json.loads(CliRunner().invoke(cli, ["brute", "--model", files["model"], "--system", small,
                                                   "--gpus", 4096, "--json"]).stdout)
    assert document["evaluated"] == 0 and document["proof"].startswith("network size")


def tmp_system(files, networks) -> str:
    path = Path(files["dir"]) / "small-networks.yaml"
    path.write_text(yaml.safe_dump({**SYSTEM_DATA, "networks": networks}))
    return str(path)


def test_the_search_tables_are_built_under_the_time_limit(files, monkeypatch):
    """The exact model's tables (minutes for a 2,048-expert MoE on 16K GPUs) check the deadline
    between chunks, between stage tables and per split: a deadline passed at any of those
    checks ends the solve there, status unknown."""
    from solver.search import engine as engine_module
    from solver.search.solve import SolverConfig

    model, system = load_model(files["moe"]), load_system(files["system"])
    splits = len(engine_module.Engine(model, system, 8, 8, Datatype.bfloat16, get_space("full"),
                                      Kernels()).plan.skeletons)
    calls = []
    real = engine_module._check
    monkeypatch.setattr(engine_module, "_check", lambda deadline: calls.append(deadline) or real(deadline))
    assert solve(model, system, 8, max_batch=8).status == SolveStatus.optimal
    assert len(calls) > 3 + splits         # the tables' and the floors' checks too

    for stop_at in (3, 4, len(calls) // 2, len(calls) - 2):
        seen = []

        def out_of_time_at(deadline, stop_at=stop_at, seen=seen):
            seen.append(deadline)
            if len(seen) >= stop_at:
                raise engine_module.OutOfTime

        monkeypatch.setattr(engine_module, "_check", out_of_time_at)
        result = solve(model, system, 8, max_batch=8, config=SolverConfig(time_limit_s=60))
        assert result.status == SolveStatus.unknown and result.best is None and len(seen) == stop_at


# ---------------------------------------------------------------- 8. misleading or silent

def test_a_plan_out_of_time_says_so_rather_than_infeasible(files):
    args = ["--model", files["model"], "--system", files["system"], "--gpus", "2,4", "--tokens", "1e9",
            "--time-limit", "0.000001"]
    result = mapsat("plan", *args)
    assert_refused(result, "no GPU count was answered within the time limit", "--time-limit")
    table = result.output.split("error:")[0]
    assert "infeasible" not in table and "no answer" in table
    document = json.loads(CliRunner().invoke(cli, ["plan", *args, "--json"]).stdout)
    assert not any(row["answered"] or row["feasible"] for row in document["counts"])


@pytest.mark.parametrize("address", ["", "   ", "scheduler", "tcp://host:0", "tcp://host:99999999", "tcp://:8786",
                                     "http://host:8786", "tcp://host:8786/x"])
def test_a_dask_address_that_is_none_is_refused_not_run_locally(files, tmp_path, address):
    batch = tmp_path / "batch.yaml"
    batch.write_text(f"models: [{files['model']}]\nsystems: [{files['system']}]\ngpus: [2]\n")
    assert_refused(mapsat("batch", batch, "--out", tmp_path / "out", "--dask", address), "--dask", "host:port")
    assert not (tmp_path / "out").exists()


def _mapping_file(tmp_path, **fields) -> Path:
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps({**MAPPING_DATA, "num_procs": 4, "tensor_par": 1, "pipeline_par": 1, "data_par": 4,
                                "batch_size": 4, "microbatch_size": 1, **fields}))
    return path


@pytest.mark.parametrize("fields, fragment", [
    ({"sharding_group": 2}, "sharding_group(2) with sharding_stage(0)"),
    ({"context_par_comm": "a2a"}, "context_par_comm(a2a) with context_par(1)"),
    ({"context_par_comm": "all_gather"}, "context_par_comm(all_gather) with context_par(1)"),
])
def test_a_mapping_that_contradicts_itself_is_refused(files, tmp_path, fields, fragment):
    path = _mapping_file(tmp_path, **fields)
    assert_refused(mapsat("eval", "--model", files["model"], "--system", files["system"], "--mapping", path),
                   fragment)
    ok = _mapping_file(tmp_path, **fields, sharding_stage=1, **({"context_par": 2, "data_par": 2}
                                                                if "context_par_comm" in fields else {}))
    assert mapsat("eval", "--model", files["model"], "--system", files["system"], "--mapping", ok).exit_code == 0


def test_bf16_ends_past_half_the_blocks_are_refused(files):
    args = ["--model", files["model"], "--system", H100_SYSTEM, "--gpus", 2, "--precision", "fp8-tensorwise"]
    assert_refused(mapsat("solve", *args, "--bf16-first-last-blocks", 2), "bf16_first_last_blocks 2",
                   "> num_blocks(2); at most 1")
    assert mapsat("solve", *args, "--bf16-first-last-blocks", 1, "--time-limit", 10).exit_code == 0


@pytest.mark.parametrize("kind, fields, fragment", [
    ("qwen3_moe", {"mlp_only_layers": [0, 48, 100]}, "mlp_only_layers [48, 100] past the last layer (47"),
    ("qwen2_moe", {"decoder_sparse_step": 25}, "decoder_sparse_step 25 > num_hidden_layers 24"),
    ("llama", {"sliding_window": 1024}, "sliding_window 1024 with model_type llama"),
    ("nemotron", {"sliding_window": 512}, "sliding_window 512 with model_type nemotron"),
])
def test_config_fields_past_the_layers_or_unread_are_refused_not_dropped(tmp_path, kind, fields, fragment):
    path = _write_config(tmp_path, {**VALID_CONFIGS[kind], **fields})
    assert_refused(mapsat("count", "--model", path, "--seq-size", 4096, "--system", H100_SYSTEM, "--gpus", 8),
                   fragment)


def test_a_llama_window_no_shorter_than_the_sequence_changes_nothing(tmp_path):
    plain = load_model(_write_config(tmp_path, VALID_CONFIGS["llama"]), seq_size=4096)
    windowed = load_model(_write_config(tmp_path, {**VALID_CONFIGS["llama"], "sliding_window": 4096}), seq_size=4096)
    assert windowed == plain


# ---------------------------------------------------------------- 9. plan, layouts and scale

def _finite_positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


@st.composite
def plan_arguments(draw) -> list[str]:
    """`plan` options at their extremes: GPU lists and ranges (steps that do not fit, counts past
    the cap), tokens, deadline, budget and price, failure rate and restart."""
    gpus = draw(st.sampled_from(["2", "2,4", "1-8", "2-8:2", "8-2", "4-4:0", "2-2000000:2", "x", "2-", "", "0"]))
    args = ["--gpus", gpus, "--tokens", draw(st.sampled_from(["1", "1e9", "1e18", "0.5"]))]
    if draw(st.booleans()):
        args += ["--days", draw(st.sampled_from(["1e-12", "0.001", "1e18"]))]
    if draw(st.booleans()):
        args += ["--budget", draw(st.sampled_from(["1e-12", "100", "1e18"]))]
        if draw(st.booleans()):
            args += ["--gpu-hour-price", draw(st.sampled_from(["1e-12", "2", "1e18"]))]
    args += ["--failure-rate", draw(st.sampled_from(["0", "1e-5", "0.5", "1"])),
             "--restart-minutes", draw(st.sampled_from(["0", "10", "1e6"]))]
    return args


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(args=plan_arguments())
def test_plan_at_its_extremes_answers_finite_figures_or_refuses_in_one_line(files, args):
    result = CliRunner().invoke(cli, ["plan", "--model", files["model"], "--system", files["system"],
                                      "--time-limit", "5", *args, "--json"])
    if result.exit_code != 0:
        assert_refused(result)
        return
    document = json.loads(result.stdout)
    chosen = [row for row in document["counts"] if row["num_gpus"] == document["chosen"]]
    assert chosen and chosen[0]["feasible"]
    for row in document["counts"]:
        if row["feasible"]:
            assert _finite_positive(row["wall_days"], row["wall_s"], row["gpu_hours"], row["compute_s"], row["mfu"])
            assert 0 < row["failures"]["goodput"] <= 1 and row["mfu"] <= 1


@pytest.mark.parametrize("phases, fragment", [
    ("phases: []", "phases"),
    ("phases: [{tokens: 1e9}]", "seq_size"),
    ("phases: [{tokens: -1, seq_size: 64}]", "tokens"),
    ("phases: [{tokens: 1e9, seq_size: 64, batch: 3, batch_tokens: 192}]", "give one of them"),
    ("phases: [{tokens: 1e9, seq_size: 64, batch_tokens: 100}]", "not a whole number of sequences"),
    ("phases: [{tokens: .nan, seq_size: 64}]", "tokens"),
    ("phases: {tokens: 1e9}", "phases"),
])
def test_a_malformed_phases_file_is_one_line(files, tmp_path, phases, fragment):
    path = tmp_path / "phases.yaml"
    path.write_text(phases + "\n")
    assert_refused(mapsat("plan", "--model", files["model"], "--system", files["system"], "--gpus", 2,
                          "--phases", path), fragment)


@pytest.mark.parametrize("layout", ["", "|", "t" * 10, "(t|)*0", "t*0|t*0", "E|t*2|t*2|L", "((t*2|)*2)*2",
                                    "(t*2|)*999999999", "t*" + "9" * 30, "Et*4|(t*4|*14tmL"])
def test_every_layout_reads_or_is_refused_by_name(layout):
    from costmodel.terms.pipeline_layout import layout_chunks, stage_layout

    for pp, chunks in ((1, 1), (2, 1), (4, 2)):
        try:
            blocks = layout_chunks(layout, pp, chunks)
            assert len(blocks) == pp and all(len(rank) == chunks and min(rank) >= 0 for rank in blocks)
            stage_layout(layout, pp, chunks)
        except InputError as err:
            assert "pipeline_layout" in str(err) and "\n" not in str(err) and len(str(err)) <= MAX_ERROR_LINE


SCALE = {
    "1e6-gpus": ({}, ["--gpus", 2**20]),
    "100T-params": ({"hidden": 1 << 17, "feedforward": 1 << 19, "attn_heads": 1024, "attn_size": 128,
                     "num_blocks": 512}, ["--gpus", 1 << 16]),
    "1e4-experts": ({"num_experts": 10_000, "experts_per_token": 8, "expert_feedforward": 128}, ["--gpus", 64]),
    "1M-tokens": ({"seq_size": 1 << 20}, ["--gpus", 64]),
}


@pytest.mark.parametrize("case", list(SCALE))
def test_scale_extremes_answer_or_refuse_within_the_time_limit(files, tmp_path, case):
    """10⁶ GPUs, 100T parameters, 10⁴ experts, a 1M-token sequence: `count` answers in closed
    form; `solve` answers with finite figures, proves infeasibility, or says the time limit came
    first — within it and a start-up margin, and under 2 GiB more memory."""
    fields, gpus = SCALE[case]
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({**TINY, **fields}))
    problem = ["--model", path, "--system", H100_SYSTEM, *gpus]
    counted = mapsat("count", *problem, "--json")
    assert counted.exit_code == 0 and json.loads(counted.stdout)["mappings"] >= 0
    started, rss_before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = mapsat("solve", *problem, "--time-limit", 3, "--json")
    assert time.perf_counter() - started < 3 + 20
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 2 << 20      # KiB
    if result.exit_code == 0:
        best = json.loads(result.stdout)["best"]
        assert _finite_positive(best["iteration_time_s"], best["mfu"]) and best["mfu"] <= 1
    else:
        assert_refused(result)


def test_a_dask_address_that_answers_garbage_is_one_line_naming_it(files, tmp_path):
    """Something other than a Dask scheduler on the port: its reply, read as a frame length,
    once asked for 3 EiB; the line names the address, not the memory."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def answer_garbage():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                connection.sendall(b"\xff" * 4096)

    threading.Thread(target=answer_garbage, daemon=True).start()
    batch = tmp_path / "batch.yaml"
    batch.write_text(f"models: [{files['model']}]\nsystems: [{files['system']}]\ngpus: [2]\n")
    address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    try:
        line = assert_refused(mapsat("batch", batch, "--out", tmp_path / "out", "--dask", address, "--quiet"),
                              f"--dask {address}")
    finally:
        server.close()
    assert "EiB" not in line and "something answered there, but not a Dask scheduler" in line


# ---------------------------------------------------------------- --precision against every system

SYSTEM_FILES = sorted((Path(__file__).resolve().parents[2] / "problems" / "systems").glob("*.yaml"))


@pytest.mark.parametrize("system_file", SYSTEM_FILES, ids=[p.stem for p in SYSTEM_FILES])
def test_every_recipe_on_every_system_answers_or_is_one_line_naming_why(system_file):
    """Each recipe on each shipped system: a recipe the file lists is counted (exit 0); any other
    is one line naming the recipe, the GPU and, where the GPU's compute capability is below what
    Transformer Engine needs, that capability; no traceback."""
    from costmodel.inputs.precision import Precision

    system = load_system(system_file)
    listed = set(system.precision.recipes)
    for precision in Precision:
        result = CliRunner().invoke(cli, ["count", "--model", str(MODELS_DIR / "gpt-1.3b.yaml"), "--system",
                                          str(system_file), "--gpus", "8", "--precision", precision.value])
        assert "Traceback" not in result.output
        if precision in listed:
            assert result.exit_code == 0, (system_file.name, precision, result.output)
            continue
        assert result.exit_code != 0 and result.output.count("\n") == 1, (system_file.name, precision, result.output)
        assert f"precision {precision.value}:" in result.output and "does not run it" in result.output
        assert "compute capability" in result.output, result.output
