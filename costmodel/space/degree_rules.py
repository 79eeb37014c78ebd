"""The rules a mapping's numbers must satisfy for a model (tp, cp, ep, etp and MoE parallel
folding, the pipeline layout, sequence parallelism's split, the shard group), as the `fits`
functions of their declarations in costmodel.space.dimensions: each takes (model, system, values by
short name) and returns why the value does not fit, or None."""

from __future__ import annotations

from costmodel.space.choices import TPComm
from costmodel.space.layout import layout_problem


def tp_fits(model, system, v) -> str | None:
    tp = v["tp"]
    if model.attn_heads % tp:
        return f"tensor_par({tp}) does not divide attn_heads({model.attn_heads})"
    if model.kv_groups % tp:
        return (f"tensor_par({tp}) does not divide kv_heads({model.kv_groups}): each tensor-parallel rank "
                f"holds whole key/value heads (Megatron-LM's rule for query groups)")
    mamba = model.mamba
    if mamba is not None and (mamba.heads % tp or mamba.groups % tp):
        return (f"tensor_par({tp}) does not divide the Mamba-2 heads({mamba.heads}) and groups({mamba.groups}): "
                f"Megatron-Core's MambaMixer splits both (mamba_mixer.py)")
    for name in ("hidden", "feedforward"):
        if getattr(model, name) % tp:
            return f"tensor_par({tp}) does not divide {name}({getattr(model, name)})"
    return None


def cp_fits(model, system, v) -> str | None:
    cp = v["cp"]
    if cp > 1 and model.seq_size % (2 * cp):
        return (f"context_par({cp}) needs seq_size({model.seq_size}) divisible by 2·context_par = {2 * cp}: "
                f"causal load balancing cuts the sequence into 2·cp chunks (Megatron-LM)")
    if cp > 1 and model.layer_pattern is not None:
        return (f"context_par({cp}) with a layer pattern is not modelled (Megatron-Core runs Mamba layers under "
                f"context parallelism by an all-to-all to head sharding, mamba_context_parallel.py: not costed)")
    return None


def ep_fits(model, system, v) -> str | None:
    ep = v["ep"]
    if ep == 1:
        return None
    if not model.num_experts:
        return f"expert_par({ep}) needs a mixture-of-experts model: {model.name!r} is dense (num_experts 0)"
    if model.num_experts % ep:
        return f"expert_par({ep}) does not divide num_experts({model.num_experts})"
    return None


def etp_fits(model, system, v) -> str | None:
    """Expert tensor parallelism splits each expert's width; with ep it folds into the
    tp·cp·dp GPUs of a pipeline stage (Megatron-LM's expert rank generator)."""
    etp = v["etp"]
    if etp > 1 and not model.num_experts:
        return (f"expert_tensor_par({etp}) needs a mixture-of-experts model: {model.name!r} is dense "
                f"(num_experts 0)")
    if etp > 1 and model.expert_feedforward % etp:
        return f"expert_tensor_par({etp}) does not divide expert_feedforward({model.expert_feedforward})"
    if "dp" in v:
        return fold_problem(v["tp"], v.get("cp", 1), v["dp"], v["ep"], etp)
    return None


def etp_default(v, moe: bool) -> int:
    """etp left out of a file: as Megatron-LM's --expert-tensor-parallel-size, tp for a
    mixture-of-experts model (parallel_state.initialize_model_parallel: `if
    expert_tensor_parallel_size is None: expert_tensor_parallel_size =
    tensor_model_parallel_size`), 1 for a dense one (which has no experts to split)."""
    return v["tp"] if moe else 1


def fold_problem(tp: int, cp: int, dp: int, ep: int, etp: int) -> str | None:
    """MoE parallel folding: the expert groups (etp innermost, then ep, then the expert data
    parallelism) tile the tp·cp·dp GPUs of a pipeline stage, so ep·etp divides tp·cp·dp
    (Megatron-LM parallel_state.initialize_model_parallel: world size divisible by
    expert_tensor_parallel_size·expert_model_parallel_size·pipeline_model_parallel_size)."""
    if (tp * cp * dp) % (ep * etp):
        return (f"expert_par({ep})·expert_tensor_par({etp})={ep * etp} does not divide tensor_par({tp})·"
                f"context_par({cp})·data_par({dp})={tp * cp * dp}: the expert groups fold into a pipeline "
                f"stage's GPUs (Megatron-LM)")
    return None


def pp_fits(model, system, v) -> str | None:
    # pp lays the blocks out by the layout rule of costmodel.space.layout (even, the
    # embedding and the loss counted as blocks, or a short last chunk: each valid with some
    # interleaving only when valid without); a preset may ask for even stages (Space.uneven_stages)
    return layout_problem(model.num_blocks, v["pp"], 1)


def interleaving_fits(model, system, v) -> str | None:
    return layout_problem(model.num_blocks, v["pp"], v["interleaving"])


def seq_par_fits(model, system, v) -> str | None:
    cp = v.get("cp", 1)
    if v["tp_comm"] is TPComm.rs_ag and (v["microbatch"] * model.seq_size) % (v["tp"] * cp):
        return (f"sequence parallelism splits microbatch_size·seq_size/context_par = {v['microbatch']}·"
                f"{model.seq_size}/{cp} tokens, which tensor_par({v['tp']}) does not divide")
    return None


def shard_fits(model, system, v) -> str | None:
    group = v["dp"] * v.get("cp", 1)
    shard = v.get("shard")
    if shard is not None and (shard < 1 or group % shard):
        return f"sharding_group({shard}) does not divide data_par({v['dp']})·context_par({v.get('cp', 1)})={group}"
    return None
