"""The pipeline schedule: the 1F1B bubble, and how many blocks' activations a stage keeps
alive at its peak.

Every function takes the backend `xp` (costmodel.ops), so pp, v and the microbatch count may
be scalars or numpy arrays.
"""

from __future__ import annotations


def bubble_microbatches(xp, p, v, microbatches):
    """The 1F1B bubble in microbatch times: (p-1)/v once the pipeline is full; with fewer
    microbatches than stages interleaving cannot fill it and it is p-1."""
    return xp.where(microbatches >= p, (p - 1) / v, p - 1.0)


def blocks_in_flight(xp, blocks_per_stage, p, v, microbatches):
    """Blocks whose activations are alive at the peak on a first-stage GPU: p microbatches of
    the stage's blocks for 1F1B; (p·v + p - 1) chunks of blocks/(p·v) blocks when
    interleaved (Korthikanti et al. 2022 §4.2.3: L·(1 + (p-1)/(p·v)) layers); fewer if there
    are fewer microbatches."""
    return xp.where(v == 1, blocks_per_stage * xp.minimum(p, microbatches),
                    blocks_per_stage / v * xp.minimum(microbatches * v, p * v + p - 1))


def blocks_in_flight_last_stage(xp, blocks_per_stage, p, v, microbatches):
    """Blocks whose activations are alive at the peak on a last-stage GPU: one microbatch
    for 1F1B (its backward follows its forward at once); (p·v - p + 1) chunks when
    interleaved (Megatron's warm-up of (v-1)·p chunks on the last rank, plus one); fewer if
    there are fewer microbatches. With p = 1 it equals blocks_in_flight."""
    return blocks_per_stage / v * xp.minimum(microbatches * v, p * v - p + 1)
