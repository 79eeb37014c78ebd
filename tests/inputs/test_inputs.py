"""The three inputs: every shipped file loads, and every kind of bad input is an InputError
whose one-line message names the file, the field and the value."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import A100_SYSTEM, H100_SYSTEM, MAPPINGS_DIR, MODELS_DIR, SYSTEMS_DIR
from costmodel.errors import InputError
from costmodel.inputs.load import load_mapping, load_model, load_system, read_document
from costmodel.inputs.mapping import Mapping, Recompute, TPComm, check_mapping_fits
from costmodel.inputs.system import Datatype, System
from costmodel.measured.validation import load_selene_data, selene_mapping
from solver.cli.options import load_problem

MODEL_FILES = sorted(MODELS_DIR.glob("*.yaml"))
SYSTEM_FILES = sorted(SYSTEMS_DIR.glob("*.yaml"))
MAPPING_FILES = sorted(MAPPINGS_DIR.glob("*.json"))

# Selene validation keys (shared/validation/selene-2022.json) → shipped model names.
SELENE_MODELS = {"22B": "megatron-22b", "175B": "gpt3-175b", "530B": "megatron-530b", "1T": "megatron-1t"}


def one_line_error(excinfo: pytest.ExceptionInfo, *fragments: str) -> str:
    """The error's message, after checking it is one line and contains every fragment."""
    message = str(excinfo.value)
    assert "\n" not in message, f"not one line: {message!r}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


LOADERS = {"model": (load_model, "model.yaml"), "system": (load_system, "system.yaml"),
           "mapping": (load_mapping, "mapping.json")}


def load_fails(write_file, kind: str, data) -> tuple[pytest.ExceptionInfo, Path]:
    """Write `data` as a `kind` file, load it, and return the InputError raised and the path."""
    load, file_name = LOADERS[kind]
    path = write_file(file_name, data)
    with pytest.raises(InputError) as excinfo:
        load(path)
    return excinfo, path


def parent_of(data: dict, where: tuple) -> dict:
    """The dict or list holding the field at path `where` (keys and list indices) in `data`."""
    for key in where[:-1]:
        data = data[key]
    return data


def model_for_mapping(path: Path) -> Path:
    """Mapping files are named <model>-<variant>.json: the longest model name that prefixes it
    (a model file <name>.yaml, or a Hugging Face config <name>/config.json)."""
    models = {m.stem: m for m in MODEL_FILES} | {d.name: d / "config.json" for d in MODELS_DIR.iterdir()
                                                 if (d / "config.json").is_file()}
    stems = [stem for stem in models if path.stem.startswith(stem + "-")]
    assert stems, f"{path.name}: no model in problems/models/ prefixes its name"
    return models[max(stems, key=len)]


# ---------------------------------------------------------------- shipped files


def test_problem_directories_are_not_empty():
    assert len(MODEL_FILES) >= 6 and SYSTEM_FILES and MAPPING_FILES


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.name)
def test_shipped_model_loads(path):
    model = load_model(path)
    assert model.name == path.stem
    assert model.total_params > 0


@pytest.mark.parametrize("path", SYSTEM_FILES, ids=lambda p: p.name)
def test_shipped_system_loads(path):
    system = load_system(path)
    assert system.name == path.stem
    assert [n.size for n in system.networks] == sorted(n.size for n in system.networks)


def _strings_that_are_numbers(node, where=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings_that_are_numbers(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings_that_are_numbers(value, f"{where}[{i}]")
    elif isinstance(node, str):
        try:
            float(node)
        except ValueError:
            return
        yield f"{where} = {node!r}"


@pytest.mark.parametrize("path", MODEL_FILES + SYSTEM_FILES, ids=lambda p: p.name)
def test_shipped_yaml_has_no_numbers_read_as_strings(path):
    # YAML 1.1 (PyYAML) reads 1e9 and 1.5e9 as strings; pydantic would quietly convert them,
    # so a file could mean something else to another YAML reader. Write 1.5e+9.
    assert list(_strings_that_are_numbers(yaml.safe_load(path.read_text()))) == []


@pytest.mark.parametrize("path", MAPPING_FILES, ids=lambda p: p.name)
def test_shipped_mapping_loads_and_fits_its_model(path):
    mapping = load_mapping(path)
    # Every field is spelled out, so the files document the whole Calculon format; the stage
    # layout, the precision recipe's settings, CUDA graphs, the loss, the pipeline sends' overlap
    # and the memory features of today's runs (mapsat's additions, optional: pp's rule, the
    # datatype's costing, none, the fused loss, exposed sends and the searched recompute when left
    # out; the MoE dispatcher, its backend, overlap and SM share: alltoall, deepep, none, unset) are not Calculon's; nor is expert
    # tensor parallelism, whose default (tp for an MoE model, 1 for a dense one) follows the model, with its
    # network; nor the CP communication and the shard group, whose defaults (the p2p ring, the whole dp·cp group)
    # these runs used — but Llama 3's 131K run, which states its all-gather CP and ZeRO over its 8 DP ranks.
    calculon = set(Mapping.model_fields) - {"pipeline_first_stage_blocks", "pipeline_last_stage_blocks",
                                            "precision", "optimizer_state", "low_precision_param_gather",
                                            "bf16_first_last_blocks", "cuda_graphs", "fused_cross_entropy",
                                            "pipeline_comm_overlap", "moe_dispatcher", "moe_flex_backend", "moe_comm_overlap",
                                            "moe_dispatcher_sm_share",
                                            "recompute_blocks", "recompute_modules",
                                            "megatron_fsdp", "activation_offload_blocks",
                                            "expert_tensor_par", "expert_tensor_par_net", "context_par_comm",
                                            "sharding_group"}
    if path.name == "llama-3.1-405b-cp16-131k.json":
        calculon |= {"context_par_comm", "sharding_group"}
    assert set(json.loads(path.read_text())) == calculon
    model_path = model_for_mapping(path)
    # a Hugging Face config states no training sequence: those mapping files name it (-131k)
    seq_size = 131072 if "-131k" in path.stem else None
    check_mapping_fits(load_model(model_path, seq_size=seq_size), load_system(H100_SYSTEM), mapping)


@pytest.mark.parametrize("key", SELENE_MODELS)
def test_selene_models_and_mappings_match_the_measurements(key):
    # the project's copy of the measurements (costmodel/data/selene-2022.json, source cited there)
    data = load_selene_data()
    name = SELENE_MODELS[key]
    model = load_model(MODELS_DIR / f"{name}.yaml")
    assert model.model_dump(exclude={"name"}, exclude_unset=True) == {
        k: v for k, v in data["models"][key].items() if k != "name"}
    measured = data["mappings"][key]
    for variant in ("full", "seqsel"):
        mapping = load_mapping(MAPPINGS_DIR / f"{name}-{variant}.json")
        assert (mapping.num_procs, mapping.tp, mapping.pp, mapping.dp) == (
            measured["num_procs"], measured["tensor_par"], measured["pipeline_par"], measured["data_par"])
        assert (mapping.batch_size, mapping.microbatch_size, mapping.pipeline_interleaving) == (
            measured["batch_size"], measured["microbatch_size"], measured["pipeline_interleaving"])
        assert mapping.datatype is Datatype.float16  # "fp16 mixed precision"
        assert not mapping.optimizer_sharding
        assert mapping == selene_mapping(data, key, variant)
    full = load_mapping(MAPPINGS_DIR / f"{name}-full.json")
    assert (full.activation_recompute, full.tensor_par_comm_type) == (Recompute.full, TPComm.ar)
    seqsel = load_mapping(MAPPINGS_DIR / f"{name}-seqsel.json")
    assert (seqsel.activation_recompute, seqsel.tensor_par_comm_type, seqsel.seq_par_ag_redo) == (
        Recompute.attn_only, TPComm.rs_ag, True)


def test_h100_system_has_the_public_peaks():
    system = load_system(H100_SYSTEM)
    peaks = {d.value: (c.matrix_tflops, c.vector_tflops) for d, c in system.compute.items()}
    assert peaks == {"float8": (1979, 133.8), "bfloat16": (989, 133.8), "float16": (989, 133.8),
                     "float32": (495, 67)}
    assert (system.hbm.capacity_gib, system.hbm.bandwidth_gbps) == (80, 3350)
    assert system.offload is None
    nvlink, infiniband = system.networks
    assert (nvlink.size, nvlink.bandwidth_gbps) == (8, 450)       # 900 GB/s both directions
    assert infiniband.bandwidth_gbps == 50                          # 400 Gb/s per GPU
    assert infiniband.size >= 16384                                 # the largest studies


def test_paper2023_h100_efficiency_curves_follow_the_a100_calibration():
    # The 2023 papers' assumed H100 (h100-80g-nvl8-paper2023.yaml) derives its curves from the
    # A100 calibration (see its header): the same efficiencies at the same time at peak, i.e.
    # breakpoints scaled by the ratio of peaks (to the 3 digits written). If the A100
    # calibration changes, re-derive them. (The measured H100 is h100-80g-nvl8.yaml.)
    h100, a100 = load_system(SYSTEMS_DIR / "h100-80g-nvl8-paper2023.yaml"), load_system(A100_SYSTEM)

    def at_time(curve, rate_per_s):
        """The curve as [seconds at peak..., efficiency...], one flat list for pytest.approx."""
        return [size / rate_per_s for size, _ in curve] + [efficiency for _, efficiency in curve]

    # The A100 has no FP8: the H100's FP8 curve is scaled from the A100's 16-bit one.
    a100_counterpart = {"float8": "float16", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
    for datatype, compute in h100.compute.items():
        reference = a100.compute[Datatype(a100_counterpart[datatype.value])]
        assert at_time(compute.matrix_efficiency, compute.matrix_flops_per_s) == pytest.approx(
            at_time(reference.matrix_efficiency, reference.matrix_flops_per_s), rel=0.01), datatype
        assert at_time(compute.vector_efficiency, compute.vector_flops_per_s) == pytest.approx(
            at_time(reference.vector_efficiency, reference.vector_flops_per_s), rel=0.01), datatype
    assert at_time(h100.hbm.efficiency, h100.hbm.bandwidth_bytes_per_s) == pytest.approx(
        at_time(a100.hbm.efficiency, a100.hbm.bandwidth_bytes_per_s), rel=0.01)


# ---------------------------------------------------------------- files that cannot be read


def test_missing_file(tmp_path):
    with pytest.raises(InputError) as excinfo:
        load_model(tmp_path / "nope.yaml")
    one_line_error(excinfo, "nope.yaml", "no such file")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(InputError) as excinfo:
        load_system(tmp_path)
    one_line_error(excinfo, str(tmp_path), "is a directory")


def test_malformed_yaml(write_file):
    path = write_file("model.yaml", "hidden: 1024\nfeedforward: [4096, 8192\nseq_size: 2048\n")
    with pytest.raises(InputError) as excinfo:
        load_model(path)
    one_line_error(excinfo, str(path), "not valid YAML at line")


def test_malformed_json(write_file):
    path = write_file("mapping.json", '{\n  "num_procs": 8,\n}\n')
    with pytest.raises(InputError) as excinfo:
        load_mapping(path)
    one_line_error(excinfo, str(path), "not valid JSON at line 3")


@pytest.mark.parametrize("content, kind", [("- 1\n- 2\n", "list"), ("7\n", "int"), ("just words\n", "str")])
def test_document_that_is_not_a_mapping(write_file, content, kind):
    excinfo, path = load_fails(write_file, "model", content)
    one_line_error(excinfo, str(path), "expected a mapping of field names to values", kind)


@pytest.mark.parametrize("name, content", [
    ("model.yaml", ""), ("model.yaml", " \n\n"), ("model.json", ""), ("model.yaml", "# only a comment\n"),
    ("model.yaml", "null\n"),
], ids=["empty-yaml", "blank-yaml", "empty-json", "comments-only", "null"])
def test_empty_file(write_file, name, content):
    path = write_file(name, content)
    with pytest.raises(InputError) as excinfo:
        load_model(path)
    one_line_error(excinfo, f"{path}: is empty")


def test_file_that_is_not_text(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_bytes(b"hidden: 1024\n\xff\xfe\x00")
    with pytest.raises(InputError) as excinfo:
        load_model(path)
    one_line_error(excinfo, str(path), "not a text file")


@pytest.mark.parametrize("name, content, fragment", [
    ("model.yaml", "hidden: 1024\nseq_size: 2048\nhidden: 2048\n", "field 'hidden' is given twice (line 3)"),
    ("mapping.json", '{"num_procs": 8, "tensor_par": 8, "num_procs": 16}', "field 'num_procs' is given twice"),
])
def test_field_given_twice(write_file, name, content, fragment):
    # YAML and JSON readers keep the last value quietly; a hand-edited file means one of them.
    path = write_file(name, content)
    with pytest.raises(InputError) as excinfo:
        (load_model if name.endswith(".yaml") else load_mapping)(path)
    one_line_error(excinfo, str(path), fragment)


def test_yaml_anchors_and_merge_keys_still_work(write_file):
    # A `<<:` merge whose key the mapping overrides is not a field given twice.
    text = ("common: &link {bandwidth_gbps: 300, latency_us: 10}\n"
            "networks:\n"
            "  - {<<: *link, name: nvlink, size: 8}\n"
            "  - <<: *link\n"
            "    name: infiniband\n"
            "    bandwidth_gbps: 25\n")
    data = read_document(write_file("anchored.yaml", text))
    assert data["networks"] == [{"bandwidth_gbps": 300, "latency_us": 10, "name": "nvlink", "size": 8},
                                {"bandwidth_gbps": 25, "latency_us": 10, "name": "infiniband"}]


def test_yaml_with_two_documents(write_file):
    path = write_file("model.yaml", "hidden: 1024\n---\nhidden: 2048\n")
    with pytest.raises(InputError) as excinfo:
        load_model(path)
    one_line_error(excinfo, str(path), "not valid YAML at line 2", "another document")


def test_yaml_python_tag_is_refused(write_file):
    path = write_file("model.yaml", "hidden: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(InputError) as excinfo:
        load_model(path)
    one_line_error(excinfo, str(path), "not valid YAML", "python/object")


def test_json_document_reads_as_json(write_file, mapping_data):
    assert read_document(write_file("m.json", mapping_data)) == mapping_data


# ---------------------------------------------------------------- fields


def test_unknown_model_field_suggests_the_close_match(write_file, model_data):
    model_data["vocab_sise"] = model_data.pop("vocab_size")
    excinfo, path = load_fails(write_file, "model", model_data)
    one_line_error(excinfo, str(path), "unknown field 'vocab_sise'", "did you mean 'vocab_size'?")


def test_unknown_field_without_a_close_match_has_no_suggestion(write_file, model_data):
    model_data["colour"] = "blue"
    excinfo, path = load_fails(write_file, "model", model_data)
    assert "did you mean" not in one_line_error(excinfo, "unknown field 'colour'")


def test_unknown_network_field_suggests_the_close_match(write_file, system_data):
    system_data["networks"][1]["must_be_filed"] = True
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, str(path), "unknown field 'networks.1.must_be_filed'", "did you mean 'must_be_filled'?")


def test_unknown_memory_field_suggests_the_close_match(write_file, system_data):
    system_data["hbm"]["efficency"] = system_data["hbm"].pop("efficiency")
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, "unknown field 'hbm.efficency'", "did you mean 'efficiency'?")


def test_unknown_mapping_field_suggests_the_close_match(write_file, mapping_data):
    mapping_data["data_par_overlpa"] = True
    excinfo, path = load_fails(write_file, "mapping", mapping_data)
    one_line_error(excinfo, str(path), "unknown field 'data_par_overlpa'", "did you mean 'data_par_overlap'?")


def test_unknown_compute_field_suggests_the_close_match(write_file, system_data):
    system_data["compute"]["bfloat16"]["vector_efficency"] = system_data["compute"]["bfloat16"].pop("vector_efficiency")
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, "unknown field 'compute.bfloat16.vector_efficency'", "did you mean 'vector_efficiency'?")


@pytest.mark.parametrize("loader, name, data, typo, field", [
    (load_model, "model.yaml", "model_data", "num_block", "num_blocks"),
    (load_mapping, "mapping.json", "mapping_data", "tensor_parallel", "tensor_par"),
])
def test_typo_of_a_required_field_names_the_typo(request, write_file, loader, name, data, typo, field):
    content = request.getfixturevalue(data)
    content[typo] = content.pop(field)
    path = write_file(name, content)
    with pytest.raises(InputError) as excinfo:
        loader(path)
    # The typo is reported, not the missing field it leaves behind.
    assert one_line_error(excinfo) == f"{path}: unknown field '{typo}' (did you mean '{field}'?)"


@pytest.mark.parametrize("where, typo", [
    (("compute", "bfloat16", "matrix_tflops"), "matrix_tflop"),
    (("networks", 0, "latency_us"), "latncy_us"),
    (("networks", 1, "bandwidth_gbps"), "bandwith_gbps"),
    (("hbm", "capacity_gib"), "capacity_gb"),
])
def test_typo_of_a_required_nested_field_names_the_typo(write_file, system_data, where, typo):
    node = parent_of(system_data, where)
    node[typo] = node.pop(where[-1])
    excinfo, path = load_fails(write_file, "system", system_data)
    parent = ".".join(map(str, where[:-1]))
    assert one_line_error(excinfo) == f"{path}: unknown field '{parent}.{typo}' (did you mean '{where[-1]}'?)"


def test_typo_in_a_collective_cost_suggests_the_close_match(write_file, system_data):
    system_data["networks"][0]["collectives"] = {
        "p2p": {"bytes_factor": 1, "n_offset": 0}, "all_reduce": {"bytes_factr": 2, "n_offset": -1},
        "reduce_scatter": {"bytes_factor": 1, "n_offset": -1}, "all_gather": {"bytes_factor": 1, "n_offset": -1}}
    with pytest.raises(InputError) as excinfo:
        load_system(write_file("system.yaml", system_data))
    one_line_error(excinfo, "unknown field 'networks.0.collectives.all_reduce.bytes_factr'",
                   "did you mean 'bytes_factor'?")


@pytest.mark.parametrize("field", ["hidden", "num_blocks", "attn_heads", "seq_size"])
def test_missing_model_field(write_file, model_data, field):
    del model_data[field]
    excinfo, path = load_fails(write_file, "model", model_data)
    one_line_error(excinfo, str(path), f"missing field '{field}'")


def test_missing_system_field(write_file, system_data):
    del system_data["networks"][0]["latency_us"]
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, str(path), "missing field 'networks.0.latency_us'")


def test_missing_mapping_field(write_file, mapping_data):
    del mapping_data["batch_size"]
    excinfo, path = load_fails(write_file, "mapping", mapping_data)
    one_line_error(excinfo, str(path), "missing field 'batch_size'")


def test_model_name_defaults_to_the_file_name(write_file, model_data):
    del model_data["name"]
    assert load_model(write_file("my-model.yaml", model_data)).name == "my-model"


def test_vocab_size_defaults_to_51200(write_file, model_data):
    del model_data["vocab_size"]
    assert load_model(write_file("model.yaml", model_data)).vocab_size == 51200


@pytest.mark.parametrize("value, reason", [
    ("wide", "'wide': a string, not a whole number"),
    ("1024", "'1024': a string, not a whole number (write the number without quotes)"),
    (12.5, "12.5: not a whole number"),
    ([1024], "valid integer"),
    ({"a": 1}, "valid integer"),
    (None, "valid integer"),
])
def test_wrong_type_for_a_model_size(write_file, model_data, value, reason):
    model_data["hidden"] = value
    excinfo, path = load_fails(write_file, "model", model_data)
    one_line_error(excinfo, str(path), "field 'hidden'", reason)


def test_wrong_type_names_the_value(write_file, model_data):
    model_data["num_blocks"] = "many"
    with pytest.raises(InputError) as excinfo:
        load_model(write_file("model.yaml", model_data))
    one_line_error(excinfo, "field 'num_blocks' 'many'")


@pytest.mark.parametrize("written", ["true", "yes", "on", "False", "off"])
def test_boolean_is_not_a_size(write_file, model_data, written):
    # YAML 1.1 (PyYAML) reads yes/no/on/off as booleans; pydantic's lax mode would take them as 1/0.
    text = yaml.safe_dump(model_data, sort_keys=False).replace("num_blocks: 24", f"num_blocks: {written}")
    excinfo, path = load_fails(write_file, "model", text)
    one_line_error(excinfo, str(path), "field 'num_blocks'", "a boolean, not a whole number")


@pytest.mark.parametrize("kind, where", [
    ("mapping", ("tensor_par",)),
    ("mapping", ("data_par_net",)),
    ("system", ("networks", 0, "size")),
])
def test_boolean_is_not_a_size_in_a_mapping_or_system(request, write_file, kind, where):
    content = request.getfixturevalue(f"{kind}_data")
    parent_of(content, where)[where[-1]] = True
    excinfo, _ = load_fails(write_file, kind, content)
    one_line_error(excinfo, f"field '{'.'.join(map(str, where))}' True", "a boolean, not a whole number")


@pytest.mark.parametrize("where", [("hbm", "capacity_gib"), ("networks", 0, "efficiency"),
                                   ("compute", "bfloat16", "vector_tflops")])
def test_boolean_is_not_a_number_in_a_system(write_file, system_data, where):
    parent_of(system_data, where)[where[-1]] = True
    excinfo, _ = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, f"field '{'.'.join(map(str, where))}' True", "a boolean, not a number")


def test_whole_float_is_read_as_a_size(write_file, model_data, mapping_data):
    # Decided: 24.0 (as JSON writers emit) is the whole number 24; 24.5 is an error (above).
    model_data["num_blocks"] = 24.0
    model = load_model(write_file("model.json", model_data))
    assert model.num_blocks == 24 and type(model.num_blocks) is int
    mapping_data["num_procs"] = 16.0
    assert type(load_mapping(write_file("mapping.json", mapping_data)).num_procs) is int


def test_numpy_integers_are_whole_numbers(mapping_data):
    # Solvers decode mappings from numpy arrays; their integers are sizes like any other.
    mapping = Mapping.model_validate({**mapping_data, "tensor_par": np.int64(2), "batch_size": np.int32(16),
                                      "num_procs": np.float64(16.0)})
    assert (mapping.tp, mapping.batch_size, mapping.num_procs) == (2, 16, 16)
    assert {type(mapping.tp), type(mapping.batch_size), type(mapping.num_procs)} == {int}


@pytest.mark.parametrize("kind, where", [
    ("mapping", ("microbatch_size",)),
    ("system", ("networks", 0, "size")),
])
def test_fractional_size(request, write_file, kind, where):
    content = request.getfixturevalue(f"{kind}_data")
    parent_of(content, where)[where[-1]] = 2.5
    excinfo, path = load_fails(write_file, kind, content)
    one_line_error(excinfo, str(path), f"field '{'.'.join(map(str, where))}' 2.5: not a whole number")


def test_yaml_exponent_read_as_text_is_explained(write_file, model_data):
    text = yaml.safe_dump(model_data, sort_keys=False).replace("vocab_size: 51200", "vocab_size: 5e4")
    excinfo, path = load_fails(write_file, "model", text)
    one_line_error(excinfo, str(path), "field 'vocab_size' '5e4'", "exponent without a sign", "write 5e+4")


@pytest.mark.parametrize("written", [".nan", ".inf", "-.inf"])
def test_system_number_must_be_finite(write_file, system_data, written):
    text = yaml.safe_dump(system_data, sort_keys=False).replace("capacity_gib: 80", f"capacity_gib: {written}")
    excinfo, path = load_fails(write_file, "system", text)
    one_line_error(excinfo, str(path), "field 'hbm.capacity_gib'", "finite number")


def test_efficiency_curve_must_be_finite(write_file, system_data):
    system_data["compute"]["bfloat16"]["matrix_efficiency"] = [[0, 0.5], [math.inf, 0.9]]
    with pytest.raises(InputError) as excinfo:
        load_system(write_file("system.yaml", system_data))
    one_line_error(excinfo, "field 'compute.bfloat16.matrix_efficiency.1.0' inf", "finite number")


@pytest.mark.parametrize("text", ['"hidden": NaN', '"hidden": Infinity'])
def test_json_nan_is_not_a_size(write_file, model_data, text):
    del model_data["hidden"]
    path = write_file("model.json", "{" + text + ", " + json.dumps(model_data)[1:])
    with pytest.raises(InputError) as excinfo:
        load_model(path)
    one_line_error(excinfo, str(path), "field 'hidden'", "not a finite number")


def test_long_value_is_shortened(write_file, model_data):
    model_data["hidden"] = "x" * 500
    with pytest.raises(InputError) as excinfo:
        load_model(write_file("model.yaml", model_data))
    assert len(one_line_error(excinfo, "field 'hidden' 'xxx")) < 300


def test_wrong_type_for_a_mapping_switch(write_file, mapping_data):
    mapping_data["weight_offload"] = "maybe"
    excinfo, path = load_fails(write_file, "mapping", mapping_data)
    one_line_error(excinfo, str(path), "field 'weight_offload' 'maybe'", "valid boolean")


@pytest.mark.parametrize("kind, field, value", [
    ("model", "hidden", 0), ("model", "num_blocks", -1), ("model", "seq_size", 0), ("model", "attn_heads", -16),
    ("mapping", "num_procs", 0), ("mapping", "microbatch_size", 0), ("mapping", "batch_size", -16),
    ("mapping", "tensor_par", 0), ("mapping", "pipeline_interleaving", 0),
])
def test_zero_or_negative_model_or_mapping_size(request, write_file, kind, field, value):
    data = request.getfixturevalue(f"{kind}_data")
    data[field] = value
    excinfo, path = load_fails(write_file, kind, data)
    one_line_error(excinfo, str(path), f"field '{field}' {value}", "greater than 0")


@pytest.mark.parametrize("where, value", [
    (("hbm", "capacity_gib"), 0),
    (("hbm", "bandwidth_gbps"), -1),
    (("networks", 0, "size"), 0),
    (("networks", 1, "bandwidth_gbps"), 0),
    (("compute", "bfloat16", "matrix_tflops"), -100),
])
def test_zero_or_negative_system_size(write_file, system_data, where, value):
    parent_of(system_data, where)[where[-1]] = value
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, str(path), f"field '{'.'.join(map(str, where))}' {value}", "greater than 0")


@pytest.mark.parametrize("field, value, reason", [
    ("efficiency", 1.5, "less than or equal to 1"),
    ("processor_usage", 1.0, "less than 1"),
    ("latency_us", -1, "greater than or equal to 0"),
])
def test_network_fraction_out_of_range(write_file, system_data, field, value, reason):
    system_data["networks"][0][field] = value
    with pytest.raises(InputError) as excinfo:
        load_system(write_file("system.yaml", system_data))
    one_line_error(excinfo, f"field 'networks.0.{field}' {value}", reason)


# ---------------------------------------------------------------- cross-field rules


def test_parallelism_product_differs_from_num_procs(write_file, mapping_data):
    mapping_data.update(num_procs=16, tensor_par=2, pipeline_par=4, data_par=3, batch_size=24)
    excinfo, path = load_fails(write_file, "mapping", mapping_data)
    one_line_error(excinfo, str(path), "tensor_par(2)·pipeline_par(4)·data_par(3)=24 ≠ num_procs(16)")


def test_microbatch_does_not_divide_the_local_batch(write_file, mapping_data):
    mapping_data.update(batch_size=16, data_par=2, microbatch_size=3)
    excinfo, path = load_fails(write_file, "mapping", mapping_data)
    one_line_error(excinfo, str(path), "microbatch_size(3) does not divide the local batch",
                   "batch_size/data_par = 16/2 = 8")


def test_batch_not_divisible_by_data_par(write_file, mapping_data):
    mapping_data.update(batch_size=15, microbatch_size=1)
    with pytest.raises(InputError) as excinfo:
        load_mapping(write_file("mapping.json", mapping_data))
    one_line_error(excinfo, "batch_size(15) is not divisible by data_par(2)")


def test_interleaving_without_a_pipeline(write_file, mapping_data):
    mapping_data.update(tensor_par=8, pipeline_par=1, pipeline_interleaving=2)
    with pytest.raises(InputError) as excinfo:
        load_mapping(write_file("mapping.json", mapping_data))
    one_line_error(excinfo, "pipeline_interleaving(2) needs pipeline_par > 1")


def test_inference_is_not_modelled(write_file, mapping_data):
    mapping_data["training"] = False
    with pytest.raises(InputError) as excinfo:
        load_mapping(write_file("mapping.json", mapping_data))
    one_line_error(excinfo, "training: false")


def test_calculon_boolean_tp_overlap_reads_as_ring_or_none(write_file, mapping_data):
    assert load_mapping(write_file("a.json", {**mapping_data, "tensor_par_overlap": True})).tensor_par_overlap.value == "ring"
    assert load_mapping(write_file("b.json", {**mapping_data, "tensor_par_overlap": False})).tensor_par_overlap.value == "none"


def test_unknown_datatype_in_a_mapping(write_file, mapping_data):
    mapping_data["datatype"] = "fp8"
    excinfo, path = load_fails(write_file, "mapping", mapping_data)
    one_line_error(excinfo, str(path), "field 'datatype' 'fp8'", "'float8'", "'bfloat16'")


def test_unknown_datatype_in_a_system(write_file, system_data):
    system_data["compute"]["bf16"] = system_data["compute"].pop("bfloat16")
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, str(path), "field 'compute' key 'bf16'", "'bfloat16'")


def test_datatype_the_system_does_not_have(write_file, model_data, system_data, mapping_data):
    mapping_data["datatype"] = "float8"
    model = load_model(write_file("model.yaml", model_data))
    system = load_system(write_file("system.yaml", system_data))
    mapping = load_mapping(write_file("mapping.json", mapping_data))
    with pytest.raises(InputError) as excinfo:
        check_mapping_fits(model, system, mapping)
    one_line_error(excinfo, "datatype", "'tiny-gpu' has no float8 compute (it has bfloat16)")


@pytest.mark.parametrize("change, fragments", [
    ({"tensor_par": 3, "num_procs": 24, "batch_size": 16}, ["tensor_par(3) does not divide attn_heads(16)"]),
    ({"pipeline_par": 7, "num_procs": 28, "batch_size": 16}, ["pipeline_par(7) divides neither num_blocks(24)"]),
    ({"pipeline_interleaving": 4}, ["pipeline_interleaving(4) does not divide num_blocks/pipeline_par = 24/4 = 6"]),
    ({"data_par_net": 2}, ["data_par_net: network 2 does not exist", "has 2"]),
    ({"weight_offload": True}, ["weight_offload", "no offload memory", "--offload-gib"]),
])
def test_mapping_that_does_not_fit_the_model_or_system(write_file, model_data, system_data, mapping_data,
                                                        change, fragments):
    mapping_data.update(change)
    model = load_model(write_file("model.yaml", model_data))
    system = load_system(write_file("system.yaml", system_data))
    mapping = load_mapping(write_file("mapping.json", mapping_data))
    with pytest.raises(InputError) as excinfo:
        check_mapping_fits(model, system, mapping)
    one_line_error(excinfo, *fragments)


@pytest.mark.parametrize("curve, reason", [
    ([], "at least one"),
    ([[1.0e6, 0.5]], "must start at size 0"),
    ([[0, 0.5], [1.0e9, 0.7], [1.0e6, 0.9]], "strictly ascending"),
    ([[0, 0.5], [1.0e9, 1.2]], "not in (0, 1]"),
    ([[0, 0.0]], "not in (0, 1]"),
])
def test_bad_efficiency_curve(write_file, system_data, curve, reason):
    system_data["compute"]["bfloat16"]["matrix_efficiency"] = curve
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, str(path), "compute.bfloat16.matrix_efficiency", reason)


def test_networks_listed_outermost_first(write_file, system_data):
    system_data["networks"].reverse()
    excinfo, path = load_fails(write_file, "system", system_data)
    one_line_error(excinfo, str(path), "innermost first", "nvlink size 8 < infiniband size 1024")


def test_incomplete_collectives_table(write_file, system_data):
    system_data["networks"][0]["collectives"] = {"p2p": {"bytes_factor": 1, "n_offset": 0}}
    with pytest.raises(InputError) as excinfo:
        load_system(write_file("system.yaml", system_data))
    one_line_error(excinfo, "networks.0.collectives", "missing all_reduce, reduce_scatter, all_gather")


# ---------------------------------------------------------------- system overrides


@pytest.fixture
def h100() -> System:
    return load_system(H100_SYSTEM)


def test_no_override_returns_the_same_system(h100):
    assert h100.with_overrides() is h100


def test_hbm_override_replaces_only_the_capacity(h100):
    bigger = h100.with_overrides(hbm_gib=120)
    assert bigger.hbm.capacity_gib == 120
    assert bigger.hbm.capacity_bytes == 120 * 2**30
    assert bigger.hbm.model_dump(exclude={"capacity_gib"}) == h100.hbm.model_dump(exclude={"capacity_gib"})
    assert bigger.model_dump(exclude={"hbm"}) == h100.model_dump(exclude={"hbm"})


def test_offload_override_adds_a_tier(h100):
    system = h100.with_overrides(offload_gib=1024, offload_gbps=100)
    assert (system.offload.capacity_gib, system.offload.bandwidth_gbps) == (1024, 100)
    assert system.offload.bandwidth_bytes_per_s == 100e9


def test_offload_without_bandwidth_is_as_fast_as_hbm(h100):
    assert h100.with_overrides(offload_gib=512).offload.bandwidth_gbps == h100.hbm.bandwidth_gbps


def test_offload_bandwidth_alone_needs_a_capacity(h100):
    with pytest.raises(InputError) as excinfo:
        h100.with_overrides(offload_gbps=100)
    one_line_error(excinfo, "--offload-gbps", "no offload memory", "--offload-gib")


def test_offload_override_resizes_and_removes_an_existing_tier(h100):
    system = h100.with_overrides(offload_gib=1024, offload_gbps=100)
    faster = system.with_overrides(offload_gbps=200)
    assert (faster.offload.capacity_gib, faster.offload.bandwidth_gbps) == (1024, 200)
    smaller = system.with_overrides(offload_gib=256)
    assert (smaller.offload.capacity_gib, smaller.offload.bandwidth_gbps) == (256, 100)
    assert system.with_overrides(offload_gib=0).offload is None


def test_nvlink_override_resizes_only_the_first_network(h100):
    system = h100.with_overrides(nvlink_size=16)
    assert [n.size for n in system.networks] == [16, h100.networks[1].size]
    assert system.networks[0].model_dump(exclude={"size"}) == h100.networks[0].model_dump(exclude={"size"})


@pytest.mark.parametrize("override, flag", [
    ({"hbm_gib": 0}, "--hbm-gib: 0 must be > 0"),
    ({"hbm_gib": -1.0}, "--hbm-gib: -1.0 must be > 0"),
    ({"offload_gib": -5.0}, "--offload-gib: -5.0 must be >= 0"),
    ({"offload_gib": 64, "offload_gbps": -1.0}, "--offload-gbps: -1.0 must be > 0"),
    ({"offload_gib": 64, "offload_gbps": 0}, "--offload-gbps: 0 must be > 0"),
    ({"nvlink_size": 0}, "--nvlink-size: 0 must be > 0"),
    ({"nvlink_size": 8.5}, "--nvlink-size: 8.5 is not a whole number"),
    ({"nvlink_size": True}, "--nvlink-size: True is not a number"),
])
def test_override_out_of_range(h100, override, flag):
    with pytest.raises(InputError) as excinfo:
        h100.with_overrides(**override)
    one_line_error(excinfo, flag)


@pytest.mark.parametrize("override, fragments", [
    ({"offload_gib": 64, "offload_gbps": 0}, ["--offload-gbps: 0 must be > 0"]),
    ({"nvlink_size": 100_000}, ["--nvlink-size: 100000 is larger than the next network",
                                "infiniband (size 65536)"]),
])
def test_override_that_breaks_the_schema_is_an_input_error(h100, override, fragments):
    with pytest.raises(InputError) as excinfo:
        h100.with_overrides(**override)
    one_line_error(excinfo, *fragments)


def test_override_of_an_existing_offload_tier_is_validated(h100):
    # An existing tier is resized in place; a zero bandwidth must not slip through unvalidated.
    system = h100.with_overrides(offload_gib=1024, offload_gbps=100)
    with pytest.raises(InputError) as excinfo:
        system.with_overrides(offload_gbps=0)
    one_line_error(excinfo, "--offload-gbps: 0 must be > 0")


@pytest.mark.parametrize("flag, value", [
    ("hbm_gib", math.nan), ("hbm_gib", math.inf), ("offload_gib", math.inf), ("offload_gib", math.nan),
    ("offload_gbps", math.nan), ("offload_gbps", math.inf), ("nvlink_size", math.inf),
])
def test_override_that_is_not_a_finite_number(h100, flag, value):
    override = {flag: value} if flag != "offload_gbps" else {"offload_gib": 64, flag: value}
    with pytest.raises(InputError) as excinfo:
        h100.with_overrides(**override)
    one_line_error(excinfo, f"--{flag.replace('_', '-')}: {value} is not a finite number")


def test_load_problem_applies_the_overrides():
    model, system = load_problem(str(MODELS_DIR / "gpt-1.3b.yaml"), str(H100_SYSTEM), hbm_gib=120,
                                 offload_gib=1024, offload_gbps=100, nvlink_size=16)
    assert model.name == "gpt-1.3b"
    assert (system.hbm.capacity_gib, system.offload.capacity_gib, system.offload.bandwidth_gbps,
            system.networks[0].size) == (120, 1024, 100, 16)
