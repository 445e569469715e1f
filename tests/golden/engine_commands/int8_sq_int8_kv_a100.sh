#!/usr/bin/env bash
# python build.py engine: the exact commands
set -euo pipefail
# download: mistralai/Mistral-7B-Instruct-v0.2@main -> /scratch/engine-build/hf-checkpoint (huggingface_hub.snapshot_download, allow_patterns=['*.json', '*.safetensors', 'tokenizer.model', '*.jinja'], ignore_patterns=['consolidated*'])
# [1/2] convert; log: /scratch/engine-build/logs/convert.log
python3 /app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py \
    --model_dir /scratch/engine-build/hf-checkpoint \
    --output_dir /scratch/engine-build/trtllm-checkpoint \
    --dtype bfloat16 \
    --tp_size 1 \
    --smoothquant 0.5 \
    --per_channel \
    --per_token \
    --int8_kv_cache \
    --calib_size 512 \
    --calib_dataset /data/calib
# [2/2] build; log: /scratch/engine-build/logs/build.log
trtllm-build \
    --checkpoint_dir /scratch/engine-build/trtllm-checkpoint \
    --output_dir /artifacts/engine \
    --gemm_plugin auto \
    --gpt_attention_plugin auto \
    --kv_cache_type paged \
    --remove_input_padding enable \
    --context_fmha enable \
    --use_paged_context_fmha enable \
    --max_batch_size 128 \
    --max_input_len 32256 \
    --max_seq_len 32768 \
    --max_num_tokens 8192 \
    --max_beam_width 1 \
    --multiple_profiles enable \
    --workers 1 \
    --input_timing_cache /scratch/engine-build/timing.cache \
    --output_timing_cache /scratch/engine-build/timing.cache \
    --log_level info
# finish: tokenizer files + build_manifest.json -> /artifacts/engine
