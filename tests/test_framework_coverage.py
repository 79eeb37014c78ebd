"""Every field of a mapping reaches each framework's text: changing it changes what is printed
(the setting, or the `# not expressed` line that names it), unless it is not a framework setting
at all (which network a group runs on, the cost model's MoE balance assumption)."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.space.dimensions import NETWORK_GROUPS, BY_NAME
from costmodel.frameworks.launch import EMIT_CHOICES, emit
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
DENSE = load_model(ROOT / "problems/models/llama-3.1-70b/config.json", seq_size=8192)
MOE = load_model(ROOT / "problems/models/mixtral-8x7b/config.json", seq_size=4096)

BASE = {"num_procs": 64, "tensor_par": 4, "pipeline_par": 4, "data_par": 4, "pipeline_interleaving": 2,
        "batch_size": 512, "microbatch_size": 1, "activation_recompute": "attn_only", "tensor_par_comm_type": "rs_ag",
        "tensor_par_overlap": "ring", "seq_par_ag_redo": True, "sharding_stage": 1, "data_par_overlap": True,
        "pipeline_comm_overlap": True, "precision": "fp8-tensorwise", "pipeline_par_net": 1, "data_par_net": 1}
MOE_BASE = {"num_procs": 16, "tensor_par": 2, "data_par": 8, "pipeline_par": 1, "expert_par": 4,
            "expert_tensor_par": 2, "batch_size": 128, "microbatch_size": 1, "tensor_par_comm_type": "rs_ag",
            "seq_par_ag_redo": True, "sharding_stage": 1, "moe_dispatcher": "alltoall", "data_par_net": 1}

VARIANTS = {
    "num_procs": {"num_procs": 128, "data_par": 8}, "data_par": {"num_procs": 128, "data_par": 8},
    "datatype": {"datatype": "float16", "precision": None}, "fused_activation": {"fused_activation": False},
    "fused_attention": {"fused_attention": False},
    "grad_datatype": {"grad_datatype": "16bit"},
    "pipeline_first_stage_blocks": {"pipeline_first_stage_blocks": 18, "pipeline_last_stage_blocks": 18},
    "pipeline_last_stage_blocks": {"pipeline_first_stage_blocks": 22, "pipeline_last_stage_blocks": 14},
    "precision": {"precision": "mxfp8"}, "optimizer_state": {"optimizer_state": "bf16"},
    "low_precision_param_gather": {"low_precision_param_gather": False},
    "bf16_first_last_blocks": {"bf16_first_last_blocks": 2}, "cuda_graphs": {"cuda_graphs": "per-layer"},
    "pipeline_comm_overlap": {"pipeline_comm_overlap": False}, "fused_cross_entropy": {"fused_cross_entropy": False},
    "activations_offload": {"activations_offload": True},
    "activation_offload_blocks": {"activations_offload": True, "activation_offload_blocks": 5},
    "recompute_blocks": {"activation_recompute": "full", "seq_par_ag_redo": False, "recompute_blocks": 5},
    "recompute_modules": {"recompute_modules": ("core_attn", "mlp")},
    "megatron_fsdp": {"sharding_stage": 3, "megatron_fsdp": True},
    "tensor_par": {"tensor_par": 8, "data_par": 2}, "context_par": {"context_par": 2, "data_par": 2},
    "context_par_comm": {"context_par": 2, "data_par": 2, "context_par_comm": "all_gather"},
    "pipeline_par": {"pipeline_par": 2, "data_par": 8}, "batch_size": {"batch_size": 1024},
    "pipeline_interleaving": {"pipeline_interleaving": 4}, "microbatch_size": {"microbatch_size": 2},
    "activation_recompute": {"activation_recompute": "full", "seq_par_ag_redo": False},
    "tensor_par_comm_type": {"tensor_par_comm_type": "ar", "seq_par_ag_redo": False},
    "tensor_par_overlap": {"tensor_par_overlap": "none"}, "sharding_stage": {"sharding_stage": 3},
    "sharding_group": {"sharding_group": 2}, "seq_par_ag_redo": {"seq_par_ag_redo": False},
    "data_par_overlap": {"data_par_overlap": False}, "weight_offload": {"weight_offload": True},
    "optimizer_offload": {"optimizer_offload": True},
    "pipeline_schedule": {"pipeline_interleaving": 1, "pipeline_comm_overlap": False, "pipeline_schedule": "zb-h1"},
}
MOE_VARIANTS = {"expert_par": {"expert_par": 2}, "expert_tensor_par": {"expert_tensor_par": 1},
                "moe_dispatcher": {"moe_dispatcher": "flex"}, "moe_comm_overlap": {"moe_comm_overlap": True},
                "moe_flex_backend": {"moe_dispatcher": "flex", "moe_flex_backend": "hybridep"},
                "moe_dispatcher_sm_share": {"moe_dispatcher": "flex", "moe_comm_overlap": True,
                                            "moe_dispatcher_sm_share": 20 / 132}}
NOT_FRAMEWORK_SETTINGS = ({BY_NAME[net].field for _, net in NETWORK_GROUPS}
                          | {"capacity_factor", "attention_type", "training"})
"""Which network a group runs on (NCCL places it; read back as the innermost network spanning the
group), the cost model's expert-balance assumption, Calculon's attention kind (the model's), and
`training`, which a valid mapping only holds true."""
NOT_PRINTED = {("megatron", "moe_dispatcher_sm_share"), ("torchtitan", "moe_dispatcher_sm_share")}
"""The flex dispatcher's SM share is Bridge's moe_deepep_num_sms; Megatron-LM's launch line and
torchtitan leave DeepEP at its own SM count."""


def test_every_mapping_field_has_a_variant_or_is_not_a_framework_setting():
    assert set(VARIANTS) | set(MOE_VARIANTS) | NOT_FRAMEWORK_SETTINGS == set(Mapping.model_fields)


@pytest.mark.parametrize("framework", EMIT_CHOICES)
@pytest.mark.parametrize("field", sorted({*VARIANTS, *MOE_VARIANTS}))
def test_changing_a_field_changes_the_framework_text(framework, field):
    model, base, change = (DENSE, BASE, VARIANTS.get(field)) if field in VARIANTS else (MOE, MOE_BASE,
                                                                                         MOE_VARIANTS[field])
    before = Mapping.model_validate(base)
    after = Mapping.model_validate({**base, **change})
    assert getattr(after, field) != getattr(before, field)
    if (framework, field) in NOT_PRINTED:
        return
    assert emit(after, model, SYSTEM, framework, lossy=True).text != emit(before, model, SYSTEM, framework,
                                                                         lossy=True).text


@pytest.mark.parametrize("framework", EMIT_CHOICES)
@pytest.mark.parametrize("change", [{}, {"moe_dispatcher": "flex"},
                                    {"moe_dispatcher": "flex", "moe_comm_overlap": True},
                                    {"moe_dispatcher": "flex", "moe_flex_backend": "hybridep"}])
def test_a_moe_mapping_reads_back_as_itself(framework, change):
    from costmodel.frameworks.launch import load_launch_mapping
    mapping = Mapping.model_validate({**MOE_BASE, **change})
    exported = emit(mapping, MOE, SYSTEM, framework, lossy=True)
    path = Path(__import__("tempfile").mkdtemp()) / ("job.toml" if framework == "torchtitan" else "launch.txt")
    path.write_text(exported.text)
    back = load_launch_mapping(path, MOE, SYSTEM)
    if exported.left_out:                 # what the framework cannot run is not read back
        assert framework == "torchtitan" and back != mapping
        return
    # no recipe reads back as the bf16 recipe, which costs the same with datatype bfloat16; Bridge
    # reads an overlapped flex dispatcher's unstated SM count as DeepEP's default, 20 of the H100's 132
    # (as it reads its published rows, costmodel.measured.run_bridge.FLEX_BACKEND_SMS)
    default_share = {"moe_dispatcher_sm_share": 20 / 132} if framework == "bridge" and change.get(
        "moe_comm_overlap") else {}
    assert back == Mapping.model_validate({**MOE_BASE, **change, "precision": "bf16", **default_share})
