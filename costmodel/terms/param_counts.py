"""A model's parameter counts as model cards state them, for the headers and JSON of `solve`
and `eval`.

Counted as the cards count: every block, the embedding and the output layer (one matrix when
tied), the final norm; "active" as Mistral's and Qwen's cards count it (a token's router,
shared experts and k of the E routed experts, with the embedding and the output layer), and
beside it without the input embedding (a row lookup), as OpenAI's gpt-oss card counts it.
Multi-token prediction modules are reported apart, as DeepSeek-V3's card does ("671B of the
Main Model weights and 14B of the Multi-Token Prediction (MTP) Module weights"): their own
parameters, and as the checkpoint stores them (with copies of the embedding and output layer).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from costmodel.inputs.model import Model


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts of one model (costmodel.inputs.model.Model's properties of the same names)."""

    total: int
    """every parameter of the model, MTP modules excluded"""
    active: int
    """what one token uses, embedding and output layer included"""
    active_without_embedding: int
    """`active` less the input embedding (OpenAI's gpt-oss convention)"""
    mtp: int
    """the multi-token prediction modules' own parameters (0 without them)"""
    mtp_checkpoint: int
    """the MTP modules with the embedding and output copies their checkpoint stores"""

    @staticmethod
    def of(model: Model) -> ParameterCounts:
        return ParameterCounts(total=model.total_params, active=model.active_params,
                               active_without_embedding=model.active_params_without_embedding,
                               mtp=model.mtp_params, mtp_checkpoint=model.mtp_checkpoint_params)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for a header: '671.03 B parameters, 37.55 B active (36.63 B without the
        input embedding), MTP 11.61 B apart'."""
        text = f"{self.total / 1e9:,.2f} B parameters"
        if self.active != self.total:
            text += (f", {self.active / 1e9:,.2f} B active ({self.active_without_embedding / 1e9:,.2f} B without the "
                     f"input embedding)")
        if self.mtp:
            text += f", MTP {self.mtp / 1e9:,.2f} B apart"
        return text
