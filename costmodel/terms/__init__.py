"""The formulas: every named time, byte and FLOP term of one iteration, from one block's
kernels (block, moe, latent_attention, quantize, kernel_time, layer_time, comm) through the
pipeline, data parallelism and stage memory to the iteration (iteration), and what is
counted from it (model_flops, published_flops, param_counts, training_cost)."""
