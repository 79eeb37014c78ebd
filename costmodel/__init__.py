"""An analytical model of transformer training time and memory (Calculon-class).

Three typed inputs — the model (costmodel.inputs.model.Model), the system (costmodel.inputs.system.System)
and the mapping (costmodel.inputs.mapping.Mapping) — and two evaluators over the same formulas:
`evaluate` explains one mapping term by term; `evaluate_arrays` scores many at once.
"""

from costmodel.evaluate import ArrayEvaluation, Evaluation, evaluate, evaluate_arrays
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System

__all__ = ["ArrayEvaluation", "Evaluation", "evaluate", "evaluate_arrays", "Mapping", "Model", "Datatype", "System"]
