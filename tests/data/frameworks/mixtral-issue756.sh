# Mixtral 8x7B on 16 H100s as NVIDIA/Megatron-LM issue #756 ran it (first post, 2024-03-30,
# https://github.com/NVIDIA/Megatron-LM/issues/756). Stated there: world size 16, tensor-model-parallel
# size 4, pipeline-model-parallel size 1, context-parallel size 1 (data-parallel size 4), global batch
# size 128 (the iteration lines), bf16, no FP8 (fp8 None), no recompute (recompute_granularity None),
# hidden size 4096, ffn hidden size 14336, group-query attention.
# NOT in the excerpts of the thread this project read, and assumed: expert-model-parallel size 4,
# micro-batch size 1, sequence length 4096, sequence parallelism, the distributed optimizer with
# overlapped gradient reduction and the alltoall dispatcher (the values of Megatron-LM's
# examples/mixtral/train_mixtral_8x7b_distributed.sh at d98e8a64, except ep: that script runs ep 8
# over 64 GPUs). The flags are the pinned commit's names (costmodel/data/framework-megatron-lm.yaml).
torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \
    --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm \
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 1 --context-parallel-size 1 \
    --expert-model-parallel-size 4 \
    --micro-batch-size 1 --global-batch-size 128 --seq-length 4096 \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce \
    --moe-token-dispatcher-type alltoall \
    --bf16
