"""The rules a mapping's parallel degrees must satisfy for a model (tp, cp, ep, etp and MoE
parallel folding), as the `fits` functions of their declarations in costmodel.dimensions:
each takes (model, system, values by short name) and returns why the value does not fit, or
None."""

from __future__ import annotations


def tp_fits(model, system, v) -> str | None:
    tp = v["tp"]
    if model.attn_heads % tp:
        return f"tensor_par({tp}) does not divide attn_heads({model.attn_heads})"
    if model.kv_groups % tp:
        return (f"tensor_par({tp}) does not divide kv_heads({model.kv_groups}): each tensor-parallel rank "
                f"holds whole key/value heads (Megatron-LM's rule for query groups)")
    for name in ("hidden", "feedforward"):
        if getattr(model, name) % tp:
            return f"tensor_par({tp}) does not divide {name}({getattr(model, name)})"
    return None


def cp_fits(model, system, v) -> str | None:
    cp = v["cp"]
    if cp > 1 and model.seq_size % (2 * cp):
        return (f"context_par({cp}) needs seq_size({model.seq_size}) divisible by 2·context_par = {2 * cp}: "
                f"causal load balancing cuts the sequence into 2·cp chunks (Megatron-LM)")
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
