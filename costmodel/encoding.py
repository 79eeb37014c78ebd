"""Mappings as columns of integers, so one call can score millions of them.

`MappingArrays` holds one numpy array per mapping dimension; choices are stored as small
integer codes whose order is fixed here and nowhere else. The datatype and fused-activation
switch are per-problem constants, passed to the evaluator beside the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodel.mapping import Mapping, Recompute, TPComm, TPOverlap
from costmodel.system import Datatype

# Code order for each categorical dimension: code i means CHOICES[i].
RECOMPUTE_CHOICES: tuple[Recompute, ...] = (Recompute.full, Recompute.attn_only, Recompute.none)
TP_COMM_CHOICES: tuple[TPComm, ...] = (TPComm.ar, TPComm.p2p_rs_ag, TPComm.rs_ag)
TP_OVERLAP_CHOICES: tuple[TPOverlap, ...] = (TPOverlap.none, TPOverlap.ring, TPOverlap.pipe)

RECOMPUTE_FULL, RECOMPUTE_ATTN_ONLY, RECOMPUTE_NONE = 0, 1, 2
TP_COMM_AR, TP_COMM_P2P_RS_AG, TP_COMM_RS_AG = 0, 1, 2
TP_OVERLAP_NONE, TP_OVERLAP_RING, TP_OVERLAP_PIPE = 0, 1, 2


@dataclass(frozen=True)
class MappingArrays:
    """N mappings of one model onto `num_procs` GPUs, one array (length N) per dimension."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    batch: np.ndarray
    microbatch: np.ndarray
    interleaving: np.ndarray
    recompute: np.ndarray          # code into RECOMPUTE_CHOICES
    tp_comm: np.ndarray            # code into TP_COMM_CHOICES
    tp_overlap: np.ndarray         # code into TP_OVERLAP_CHOICES
    optimizer_sharding: np.ndarray  # bool
    seq_par_ag_redo: np.ndarray    # bool
    dp_overlap: np.ndarray         # bool
    weight_offload: np.ndarray     # bool
    activations_offload: np.ndarray  # bool
    optimizer_offload: np.ndarray  # bool
    tp_net: np.ndarray             # network index
    pp_net: np.ndarray
    dp_net: np.ndarray

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, index) -> "MappingArrays":
        """The subset selected by an index array or boolean mask."""
        return MappingArrays(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def concatenate(parts: list["MappingArrays"]) -> "MappingArrays":
        return MappingArrays(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(MappingArrays)})

    def to_mapping(self, i: int, datatype: Datatype, fused_activation: bool = True,
                   fused_attention: bool = True) -> Mapping:
        """Row i as a typed Mapping (Calculon field names)."""
        tp, pp, dp = int(self.tp[i]), int(self.pp[i]), int(self.dp[i])
        return Mapping(
            num_procs=tp * pp * dp, tensor_par=tp, pipeline_par=pp, data_par=dp,
            tensor_par_net=int(self.tp_net[i]), pipeline_par_net=int(self.pp_net[i]), data_par_net=int(self.dp_net[i]),
            batch_size=int(self.batch[i]), microbatch_size=int(self.microbatch[i]), datatype=datatype,
            fused_activation=fused_activation, fused_attention=fused_attention,
            activation_recompute=RECOMPUTE_CHOICES[int(self.recompute[i])],
            pipeline_interleaving=int(self.interleaving[i]),
            optimizer_sharding=bool(self.optimizer_sharding[i]),
            tensor_par_comm_type=TP_COMM_CHOICES[int(self.tp_comm[i])],
            tensor_par_overlap=TP_OVERLAP_CHOICES[int(self.tp_overlap[i])],
            seq_par_ag_redo=bool(self.seq_par_ag_redo[i]), data_par_overlap=bool(self.dp_overlap[i]),
            weight_offload=bool(self.weight_offload[i]), activations_offload=bool(self.activations_offload[i]),
            optimizer_offload=bool(self.optimizer_offload[i]),
        )

    @staticmethod
    def from_mappings(mappings: list[Mapping]) -> "MappingArrays":
        def col(values, dtype=np.int64):
            return np.array(values, dtype=dtype)

        return MappingArrays(
            tp=col([m.tp for m in mappings]), pp=col([m.pp for m in mappings]), dp=col([m.dp for m in mappings]),
            batch=col([m.batch_size for m in mappings]), microbatch=col([m.microbatch_size for m in mappings]),
            interleaving=col([m.pipeline_interleaving for m in mappings]),
            recompute=col([RECOMPUTE_CHOICES.index(m.activation_recompute) for m in mappings], np.int8),
            tp_comm=col([TP_COMM_CHOICES.index(m.tensor_par_comm_type) for m in mappings], np.int8),
            tp_overlap=col([TP_OVERLAP_CHOICES.index(m.tensor_par_overlap) for m in mappings], np.int8),
            optimizer_sharding=col([m.optimizer_sharding for m in mappings], bool),
            seq_par_ag_redo=col([m.seq_par_ag_redo for m in mappings], bool),
            dp_overlap=col([m.data_par_overlap for m in mappings], bool),
            weight_offload=col([m.weight_offload for m in mappings], bool),
            activations_offload=col([m.activations_offload for m in mappings], bool),
            optimizer_offload=col([m.optimizer_offload for m in mappings], bool),
            tp_net=col([m.tensor_par_net for m in mappings], np.int8),
            pp_net=col([m.pipeline_par_net for m in mappings], np.int8),
            dp_net=col([m.data_par_net for m in mappings], np.int8),
        )
