"""The execution strategy: how one model is mapped onto `num_procs` GPUs.

The file format is Calculon's execution JSON, field for field. The fields of the mapping
dimensions are made from their declaration (costmodel.space.dimensions: Calculon field name,
kind, meaning), so a new dimension needs no edit here; code reads the short names `tp`,
`pp`, `dp`, ... through `Mapping.value(name)` or the properties below. Beyond Calculon, a
file may state the blocks of the first and the last pipeline stage (Megatron-LM's uneven
stages); they are not searched dimensions: left out, the layout follows pp by the rule of
costmodel.space.layout, and a mapping's JSON leaves them out too.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, Field, create_model, field_serializer, field_validator, model_serializer,
                      model_validator)

import costmodel.inputs.limits as limits
from costmodel.space.choices import AttentionType, CPComm, PipelineSchedule, Recompute, ShardingStage, TPComm, TPOverlap
from costmodel.space.dimensions import BY_NAME, CHAIN, DEGREES, DIMENSIONS, Dimension
from costmodel.errors import InputError
from costmodel.inputs.kernels import (PRECISION_DEFAULTS, CudaGraphs, GradDatatype, Kernels,
                               MoeDispatcher, MoeFlexBackend)
from costmodel.inputs.model import INPUT_CONFIG, Boolean, Model, RealNumber, WholeNumber, _whole_number, within
from costmodel.space.layout import FIRST_FIELD, LAST_FIELD, feature_problem, layout_problem
from costmodel.inputs.precision import OptimizerState, Precision
from costmodel.inputs.system import Datatype, System

__all__ = ["AttentionType", "Mapping", "Recompute", "ShardingStage", "TPComm", "TPOverlap", "check_mapping_fits",
           "model_with_attention_type"]

# Defaults of the fields a Calculon execution file may leave out (the skeleton has none).
# The memory features a file may state beyond Calculon's fields (left out: today's costing);
# a mapping's JSON leaves them out at these defaults.
_MEMORY_FEATURE_DEFAULTS: dict[str, Any] = {"activation_offload_blocks": None, "recompute_blocks": None,
                                            "recompute_modules": None, "megatron_fsdp": False}
RecomputeModule = Literal["core_attn", "layernorm", "mlp", "moe_act", "mla_up_proj"]
"""Megatron-LM's recompute_modules this model costs (transformer_config.py)."""

_MODEL_DECIDES: dict[str, str] = {dim.name: dim.field for dim in DIMENSIONS if dim.kind in ("split", "per_split")
                                   and dim.model_decides}
"""The numbers a file may leave to the model, name -> file field (etp: expert_tensor_par)."""
_SUBGROUP_FIELDS = tuple(dim.field for dim in DIMENSIONS if dim.kind == "subgroup")
"""The sub-group sizes' file fields (sharding_group): dp·cp itself, or None, is the whole group."""
_FLAG_DEFAULTS: dict[str, Any] = {"recompute": Recompute.none, "tp_comm": TPComm.ar, "tp_overlap": TPOverlap.none,
                                  "zero": ShardingStage.none, "sched": PipelineSchedule.one_f_one_b}


def _field(dim: Dimension) -> tuple[Any, Any]:
    """The pydantic (type, Field) of one dimension's file field."""
    if dim.kind in ("split", "per_split") and dim.model_decides:
        # unstated: the model decides (Mapping.with_model_defaults)
        return (Annotated[WholeNumber, within(dim.bound)] | None,
                Field(None, gt=0, description=dim.meaning))
    if dim.kind in ("split", "per_split"):
        return Annotated[WholeNumber, within(dim.bound)], Field(dim.default, gt=0, description=dim.meaning)
    if dim.kind == "network":
        return Annotated[WholeNumber, within(dim.bound)], Field(0, ge=0, description=dim.meaning)
    if dim.kind == "subgroup":
        return (Annotated[WholeNumber, within(dim.bound)] | None,
                Field(None, gt=0, description=dim.meaning + "; default (or dp·cp itself): the whole group"))
    if dim.kind == "switch":
        return Boolean, Field(False, description=dim.meaning)
    labels = " | ".join(c.value for c in dim.choices)
    # a choice left out is its first member (a flag's pinned value) unless stated above
    default = _FLAG_DEFAULTS.get(dim.name, next(iter(dim.choices)))
    return dim.choices, Field(default, description=f"{dim.meaning} ({labels})")


class _MappingBase(BaseModel):
    """One execution strategy. tp·cp·pp·dp must equal num_procs."""

    model_config = INPUT_CONFIG

    num_procs: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(
        gt=0, description="GPUs used: tensor_par · context_par · pipeline_par · data_par.")
    datatype: Datatype = Field(Datatype.bfloat16, description="Compute datatype.")
    fused_activation: Boolean = Field(True, description="GeLU fused into the preceding matrix multiply.")
    fused_attention: Boolean = Field(
        True, description="FlashAttention: the attention core is one kernel and the s×s scores never reach HBM "
                          "(false: four kernels through HBM, as Megatron-LM in 2022 and Calculon model it).")
    attention_type: AttentionType | None = Field(
        None, description="Calculon's attention kind, read into the model (which carries it as kv_heads): "
                          "multiquery means kv_heads = 1; multihead, that it is not 1.")
    training: Boolean = Field(True, description="Training (forward, backward, optimizer). Only training is modelled.")
    grad_datatype: GradDatatype = Field(
        "float32", description="How gradients are kept: float32 main gradients (Megatron-LM) or 16bit (DeepSpeed); "
                               "a setting of the problem, not searched.")
    pipeline_first_stage_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] | None = Field(
        None, gt=0, description="Blocks on the first pipeline stage (Megatron-LM's "
                                "--decoder-first-pipeline-num-layers); the stages between the first and the last hold "
                                "equal numbers. Default: the layout rule (num_blocks/pipeline_par, or with uneven "
                                "stages one fewer than a middle stage).")
    pipeline_last_stage_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] | None = Field(
        None, gt=0, description="Blocks on the last pipeline stage (Megatron-LM's --decoder-last-pipeline-num-layers); "
                                "default as pipeline_first_stage_blocks.")
    capacity_factor: Annotated[RealNumber, within(limits.CAPACITY_FACTOR)] = Field(
        1.0, description="Mixture-of-experts models: the busiest expert's tokens over the mean (GShard / Switch "
                         "Transformer's capacity factor; 1.0 is perfect balance); a setting of the problem, not "
                         "searched, ignored by dense models.")
    precision: Precision | None = Field(
        None, description="Precision recipe (bf16, fp8-delayed, fp8-tensorwise, fp8-blockwise, mxfp8, nvfp4: "
                          "Megatron-LM's --fp8-recipe / --fp4-recipe): which tensors are quantized; with one, "
                          "datatype stays bfloat16. Default: none, the datatype decides every byte (Calculon's).")
    optimizer_state: OptimizerState = Field("fp32", description="Adam's moments in fp32 or bf16.")
    low_precision_param_gather: Boolean | None = Field(
        None, description="Weights kept and all-gathered in the recipe's format (fp8_param_gather); default: as "
                          "Megatron-Bridge's recipe sets it.")
    bf16_first_last_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS_OR_NONE)] = Field(
        0, ge=0, description="Blocks at each end kept in BF16 under an FP8/FP4 recipe.")
    cuda_graphs: CudaGraphs = Field(
        "none", description="CUDA graphs as the framework captures them (none | per-layer | full-iteration): graphed "
                            "kernels run without the whole-step launch gap; a setting of the problem, not searched.")
    pipeline_comm_overlap: Boolean = Field(
        False, description="With an interleaved schedule (pipeline_interleaving > 1): the stage-boundary sends run "
                           "beside the chunks' compute (Megatron-LM's overlap_p2p_comm, which Megatron-Bridge turns "
                           "on whenever vp > 1); false: exposed between them, as Calculon costs them.")
    moe_dispatcher: MoeDispatcher = Field(
        "alltoall", description="Mixture-of-experts token dispatcher (Megatron-LM's moe_token_dispatcher_type): "
                                "alltoall, or flex (DeepEP / HybridEP); a setting of the problem, not searched.")
    moe_flex_backend: MoeFlexBackend = Field(
        "deepep", description="With moe_dispatcher flex: the library that runs it, deepep or hybridep (Megatron-LM's "
                              "moe_flex_dispatcher_backend, default deepep); a setting of the problem, not searched.")
    moe_comm_overlap: Boolean = Field(
        False, description="Expert-parallel dispatch and combine beside another microbatch's compute (Megatron-LM's "
                           "overlap_moe_expert_parallel_comm); a setting of the problem, not searched.")
    moe_dispatcher_sm_share: float | None = Field(
        None, gt=0, lt=1, description="With moe_dispatcher flex and moe_comm_overlap: the share of the GPU's SMs the "
                                      "DeepEP / HybridEP kernels hold while hidden behind compute (their SM count over "
                                      "the GPU's); default: the expert-parallel network's processor_usage. A setting of "
                                      "the problem, not searched.")
    fused_cross_entropy: Boolean = Field(
        True, description="The loss as Megatron-LM's fused vocab-parallel cross-entropy (6 bytes per logit); false: "
                          "eager PyTorch's log-softmax and NLL on fp32 logits (12 bytes per logit).")
    activation_offload_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] | None = Field(
        None, gt=0, description="With activations_offload: the blocks of each pipeline stage whose stored activations "
                                "go to offload memory (Megatron-LM's cpu_offloading_num_layers; HBM keeps the "
                                "others'). Default: every block.")
    recompute_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] | None = Field(
        None, gt=0, description="With activation_recompute full: the blocks of each pipeline chunk recomputed, the "
                                "first ones (Megatron-LM's recompute_method block, recompute_num_layers); the "
                                "others store their activations. Default: every block.")
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        None, description="With activation_recompute attn_only (Megatron-LM's selective granularity): the modules "
                          "whose stored activations are dropped and whose forward is rerun in backward "
                          "(recompute_modules: core_attn, layernorm, mlp, moe_act, mla_up_proj). Default: core_attn alone.")
    megatron_fsdp: Boolean = Field(
        False, description="Megatron-FSDP (data_parallel_sharding_strategy optim_grads_params): sharding_stage 3 "
                           "with its gradient reduce-scatter double buffer.")

    @model_validator(mode="before")
    @classmethod
    def _sharding_from_calculon(cls, data: Any) -> Any:
        # Calculon's files say optimizer_sharding: true/false, which is sharding stage 1/0.
        if isinstance(data, dict) and "optimizer_sharding" in data:
            data = dict(data)
            legacy = data.pop("optimizer_sharding")
            if not isinstance(legacy, bool):
                raise ValueError(f"optimizer_sharding: {legacy!r} is not true or false")
            stage = int(legacy)
            given = data.get("sharding_stage", stage)
            if str(getattr(given, "value", given)) != str(stage):
                raise ValueError(f"optimizer_sharding({legacy}) contradicts sharding_stage({given}); give only "
                                 f"sharding_stage")
            data["sharding_stage"] = given
        return data

    @model_validator(mode="before")
    @classmethod
    def _whole_subgroups(cls, data: Any) -> Any:
        # a subgroup (sharding_group) = dp·cp is the whole group, as unstated (one code for one mapping)
        if not isinstance(data, dict):
            return data
        group = data.get("data_par"), data.get("context_par", 1)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in group):
            whole = [field for field in _SUBGROUP_FIELDS if data.get(field) == group[0] * group[1]]
            data = {**data, **dict.fromkeys(whole)} if whole else data
        return data

    @field_validator("sharding_stage", mode="before", check_fields=False)
    @classmethod
    def _stage_from_int(cls, value: object) -> object:
        # Files write the stage as a number (0-3) like every number of the file: "3" is refused
        # as context_par "2" is (WholeNumber's reasons); the enum's values are its text.
        if isinstance(value, ShardingStage):
            return value
        if isinstance(value, (bool, str, int, float)):
            stage = _whole_number(value)
            if stage not in range(len(ShardingStage)):
                raise ValueError(f"not a sharding stage (0 to {len(ShardingStage) - 1})")
            return str(stage)
        return value

    @model_validator(mode="before")
    @classmethod
    def _interleaved_schedule(cls, data: Any) -> Any:
        # `interleaved` is 1F1B over pipeline_interleaving > 1 chunks (the chunks say it).
        if isinstance(data, dict) and data.get("pipeline_schedule") == "interleaved":
            chunks = data.get("pipeline_interleaving", 1)
            if not isinstance(chunks, int) or chunks <= 1:
                raise ValueError(f"pipeline_schedule(interleaved) needs pipeline_interleaving > 1, not {chunks!r}")
            data = {**data, "pipeline_schedule": PipelineSchedule.one_f_one_b}
        return data

    @field_serializer("pipeline_schedule", check_fields=False)
    def _schedule_text(self, value: PipelineSchedule) -> str:
        if value is PipelineSchedule.one_f_one_b and self.pipeline_interleaving > 1:
            return "interleaved"
        return value.value

    @model_serializer(mode="wrap")
    def _layout_only_when_stated(self, handler) -> dict:
        # A mapping without an explicit stage layout (and with the default CUDA graphs and loss)
        # dumps as Calculon's format, as before.
        data = handler(self)
        for name in (FIRST_FIELD, LAST_FIELD, *_MODEL_DECIDES.values()):
            if data.get(name, 0) is None:
                del data[name]
        for name in _MEMORY_FEATURE_DEFAULTS:
            if name in data and data[name] == _MEMORY_FEATURE_DEFAULTS[name]:
                del data[name]
        # ... and without the precision, CUDA-graph and loss settings left at their defaults.
        for name, default in (*PRECISION_DEFAULTS.items(), ("cuda_graphs", "none"), ("fused_cross_entropy", True),
                              ("pipeline_comm_overlap", False), ("moe_dispatcher", "alltoall"),
                              ("moe_flex_backend", "deepep"), ("moe_comm_overlap", False), ("moe_dispatcher_sm_share", None)):
            if name in data and data[name] == default:
                del data[name]
        return data

    @field_serializer("sharding_stage", check_fields=False)
    def _stage_as_int(self, value: ShardingStage) -> int:
        return int(value.value)

    @field_validator("tensor_par_overlap", mode="before", check_fields=False)
    @classmethod
    def _overlap_from_bool(cls, value: object) -> object:
        # Older Calculon files say true/false; true meant ring-style overlap.
        if isinstance(value, bool):
            return TPOverlap.ring if value else TPOverlap.none
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "_MappingBase":
        chain = {name: getattr(self, BY_NAME[name].field) for name in CHAIN}
        if math.prod(chain.values()) != self.num_procs:
            # (an optional degree at 1, cp, is left out of the message)
            shown = [f"{BY_NAME[name].field}({value})" for name, value in chain.items()
                     if value != 1 or BY_NAME[name].default is ...]
            raise ValueError(f"{'·'.join(shown)}={math.prod(chain.values())} ≠ num_procs({self.num_procs})")
        for field in _SUBGROUP_FIELDS:
            size = getattr(self, field)
            if size is not None and self.sharding_stage is ShardingStage.none:
                raise ValueError(f"{field}({size}) with sharding_stage(0): nothing is sharded to group (give a "
                                 f"sharding_stage of 1-3, or leave {field} out)")
            if size is not None and (self.dp * self.cp) % size:
                raise ValueError(f"{field}({size}) does not divide data_par({self.dp})·context_par({self.cp}) = "
                                 f"{self.dp * self.cp}")
        if self.cp == 1 and self.context_par_comm is not CPComm.p2p:
            raise ValueError(f"context_par_comm({self.context_par_comm.value}) with context_par(1): there is no "
                             f"context-parallel group to communicate over")
        if self.batch_size % self.dp:
            raise ValueError(f"batch_size({self.batch_size}) is not divisible by data_par({self.dp})")
        if self.local_batch % self.microbatch_size:
            raise ValueError(
                f"microbatch_size({self.microbatch_size}) does not divide the local batch "
                f"batch_size/data_par = {self.batch_size}/{self.dp} = {self.local_batch}")
        if self.pp == 1 and self.pipeline_interleaving != 1:
            raise ValueError(f"pipeline_interleaving({self.pipeline_interleaving}) needs pipeline_par > 1")
        if not self.training:
            raise ValueError("training: false (inference) is not modelled; only training iterations are")
        self._memory_features_consistent()
        try:
            self.kernels
        except InputError as err:
            raise ValueError(str(err)) from None
        return self

    def _memory_features_consistent(self) -> None:
        # Each memory feature refines a dimension's setting, and needs that setting.
        if self.activation_offload_blocks is not None and not self.activations_offload:
            raise ValueError(f"activation_offload_blocks({self.activation_offload_blocks}) needs "
                             f"activations_offload: true")
        if self.recompute_blocks is not None and self.activation_recompute is not Recompute.full:
            raise ValueError(f"recompute_blocks({self.recompute_blocks}) needs activation_recompute full, not "
                             f"{self.activation_recompute.value}")
        if self.recompute_modules is not None:
            if self.activation_recompute is not Recompute.attn_only:
                raise ValueError(f"recompute_modules needs activation_recompute attn_only (selective), not "
                                 f"{self.activation_recompute.value}")
            if not self.recompute_modules or len(set(self.recompute_modules)) != len(self.recompute_modules):
                raise ValueError(f"recompute_modules({list(self.recompute_modules)}): name each module once, at "
                                 f"least one")
        if self.megatron_fsdp and self.sharding_stage is not ShardingStage.parameters:
            raise ValueError(f"megatron_fsdp shards parameters: sharding_stage must be 3, not "
                             f"{self.sharding_stage.value}")

    # ---- the short vocabulary (costmodel.space.dimensions) ----
    def value(self, name: str) -> Any:
        """The value of dimension `name` (its short name), as the file holds it."""
        return getattr(self, BY_NAME[name].field)

    def values(self) -> dict[str, Any]:
        """Every dimension's value by short name."""
        return {dim.name: getattr(self, dim.field) for dim in DIMENSIONS}

    def with_model_defaults(self, moe: bool) -> Mapping:
        """This mapping with the numbers its file left to the model resolved, by their
        declared defaults (costmodel.space.dimensions: etp is tp for a mixture-of-experts model,
        `moe`, and 1 for a dense one)."""
        missing = [name for name, field in _MODEL_DECIDES.items() if getattr(self, field) is None]
        if not missing:
            return self
        values = self.values()
        return self.model_copy(update={BY_NAME[name].field: BY_NAME[name].default(values, moe) for name in missing})

    @property
    def local_batch(self) -> int:
        return self.batch_size // self.dp

    @property
    def num_microbatches(self) -> int:
        return self.local_batch // self.microbatch_size

    @property
    def kernels(self) -> Kernels:
        """The kernel choices the file states (problem constants, costmodel.inputs.kernels)."""
        return Kernels(fused_activation=self.fused_activation, fused_attention=self.fused_attention,
                       grad_datatype=self.grad_datatype, capacity_factor=self.capacity_factor,
                       precision=self.precision, optimizer_state=self.optimizer_state,
                       low_precision_param_gather=self.low_precision_param_gather,
                       bf16_first_last_blocks=self.bf16_first_last_blocks,
                       cuda_graphs=self.cuda_graphs, fused_cross_entropy=self.fused_cross_entropy,
                       pp_comm_overlap=self.pipeline_comm_overlap, moe_dispatcher=self.moe_dispatcher,
                       moe_flex_backend=self.moe_flex_backend, moe_comm_overlap=self.moe_comm_overlap, moe_dispatcher_sm_share=self.moe_dispatcher_sm_share)

    @property
    def optimizer_sharding(self) -> bool:
        """Calculon's name: whether the optimizer state is sharded (sharding stage >= 1)."""
        return self.sharding_stage is not ShardingStage.none

    @property
    def seq_par(self) -> bool:
        return self.tensor_par_comm_type is TPComm.rs_ag


def _degree_property(field: str) -> property:
    return property(lambda self: getattr(self, field),
                    doc=f"The degree by its short name: `{field}` (None where the model decides, until "
                        f"`with_model_defaults` has read it).")


for _degree in DEGREES:      # mapping.tp, .cp, .ep, .etp, .pp, .dp: each degree by its short name
    setattr(_MappingBase, _degree.name, _degree_property(BY_NAME[_degree.name].field))

Mapping = create_model("Mapping", __base__=_MappingBase, __module__=__name__,
                       **{dim.field: _field(dim) for dim in DIMENSIONS})
Mapping.__doc__ = _MappingBase.__doc__


def check_mapping_fits(model: Model, system: System, mapping: Mapping) -> None:
    """Rules that tie a mapping to a model and a system (each dimension's `fits`, and the
    pipeline layout of its blocks); raises InputError naming every value."""
    values = mapping.with_model_defaults(bool(model.num_experts)).values()
    for dim in DIMENSIONS:
        if dim.name == "pp":
            # pp's and interleaving's `fits` is the even split the search spaces enumerate; a
            # file may lay its blocks out by any rule costmodel.space.layout accepts.
            reason = layout_problem(model.num_blocks, mapping.pp, mapping.pipeline_interleaving,
                                    mapping.pipeline_first_stage_blocks, mapping.pipeline_last_stage_blocks)
        elif dim.name == "interleaving":
            continue
        else:
            reason = dim.fits(model, system, values) if dim.fits is not None else None
        if reason is not None:
            raise InputError(reason)
    reason = feature_problem(model.num_blocks, model.num_experts, mapping, model.latent_attention is not None)
    if reason is not None:
        raise InputError(reason)
    system.compute_for(mapping.datatype)


def model_with_attention_type(model: Model, mapping: Mapping) -> Model:
    """The model as a mapping file that states Calculon's `attention_type` describes it.

    multiquery: kv_heads = 1 — a model that states no kv_heads takes it, one that states
    another number is an InputError. multihead (Calculon's only other kind, i.e. "not
    multiquery"): a model that states no kv_heads stays multi-head, one that states a
    grouped-query kv_heads keeps it (the more specific fact), one that states kv_heads = 1
    is an InputError. Unstated (None), the model is left as it is."""
    kind = mapping.attention_type
    if kind is None:
        return model
    if kind is AttentionType.multiquery:
        if model.kv_heads is None and model.attn_heads > 1:
            return model.model_copy(update={"kv_heads": 1})
        contradicts = model.kv_groups != 1
    else:
        contradicts = model.kv_heads == 1 and model.attn_heads > 1
    if contradicts:
        raise InputError(f"attention_type: the mapping says {kind.value} but model {model.name!r} states "
                         f"kv_heads {model.kv_heads}; remove attention_type from the mapping file")
    return model
