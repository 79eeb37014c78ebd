"""Reproduce the measured Megatron-LM runs on Selene (Korthikanti et al. 2022) with one
system file: iteration time (Table 5), first-stage memory (Figure 1) and relative
activation memory (Figure 7). The data ship in costmodel/data/selene-2022.json, copied from
the paper with the source cited there."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from costmodel.evaluate import evaluate
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import System
from costmodel.inputs.units import GiB


@dataclass(frozen=True)
class Comparison:
    """One measured quantity beside the model's."""

    model: str
    quantity: str       # e.g. "iteration_time_s full", "params_and_optimizer_gib"
    measured: float
    modelled: float

    @property
    def error(self) -> float:
        """Relative error, signed: (modelled - measured) / measured."""
        return (self.modelled - self.measured) / self.measured


@dataclass(frozen=True)
class ValidationReport:
    source: str
    iteration_time: list[Comparison]
    memory: list[Comparison]
    activation_percent: list[Comparison]

    @staticmethod
    def _stats(rows: list[Comparison]) -> tuple[float, float]:
        errors = [abs(r.error) for r in rows]
        return sum(errors) / len(errors), max(errors)

    @property
    def time_mean_max(self) -> tuple[float, float]:
        return self._stats(self.iteration_time)

    @property
    def memory_mean_max(self) -> tuple[float, float]:
        return self._stats(self.memory)

    def to_dict(self) -> dict:
        def rows(items):
            return [{"model": r.model, "quantity": r.quantity, "measured": r.measured, "modelled": r.modelled,
                     "error": r.error} for r in items]

        return {"source": self.source,
                "iteration_time": {"mean_abs_error": self.time_mean_max[0], "max_abs_error": self.time_mean_max[1],
                                   "points": rows(self.iteration_time)},
                "memory": {"mean_abs_error": self.memory_mean_max[0], "max_abs_error": self.memory_mean_max[1],
                           "points": rows(self.memory)},
                "activation_percent_of_none": rows(self.activation_percent)}


def load_selene_data() -> dict:
    return json.loads(resources.files("costmodel").joinpath("data/selene-2022.json").read_text())


def selene_mapping(data: dict, model_name: str, strategy: str) -> Mapping:
    """The measured configuration of `model_name` under one of the paper's strategies."""
    return Mapping.model_validate({**data["mappings"][model_name],
                                   **{k: v for k, v in data["strategies"][strategy].items() if k != "about"}})


def validate_selene(system: System) -> ValidationReport:
    """Evaluate every measured point on `system` (meant to be a100-80g-selene.yaml)."""
    data = load_selene_data()
    times, memory, percent = [], [], []
    for name, fields in data["models"].items():
        model = Model.model_validate(fields)
        evals = {s: evaluate(model, system, selene_mapping(data, name, s)) for s in data["strategies"]}
        for strategy, measured in data["iteration_time_s"][name].items():
            times.append(Comparison(name, f"iteration_time_s {strategy}", measured, evals[strategy].iteration_time_s))
        # Figure 1 counts the transformer blocks' parameters, gradients and optimizer state,
        # and stored activations (without the embedding table and transient workspace).
        mem = evals["seqsel"].memory.as_dict()
        measured_mem = data["memory_gib_first_stage"][name]
        states = mem["weights_bytes"] + mem["weight_grads_bytes"] + mem["optimizer_bytes"]
        memory.append(Comparison(name, "params_and_optimizer_gib", measured_mem["params_and_optimizer"], states / GiB))
        for strategy in ("none", "seqsel"):
            memory.append(Comparison(name, f"activations_{strategy}_gib", measured_mem[f"activations_{strategy}"],
                                     evals[strategy].memory.activations_bytes / GiB))
        none = evals["none"].memory.activations_bytes
        for strategy, measured in data["activation_memory_percent_of_none"][name].items():
            modelled = 100 * evals[strategy].memory.activations_bytes / none
            percent.append(Comparison(name, f"activations_{strategy}_percent", measured, modelled))
    return ValidationReport(data["source"], times, memory, percent)
