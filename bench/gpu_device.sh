#!/usr/bin/env bash
# Runs ON a lent device machine: the engine on its GPU (bench/gpu_bench.py), with the wheels that
# `make gpu-wheels` put in .whl/ here. From this checkout, through the `device` tool:
#   run(command="bash bench/gpu_device.sh", carry=[".whl"], timeout_s=540)
# The figures come back in $OUT/gpu_bench.json and are printed. Extra arguments go to gpu_bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-python3}  # the device image's Python, which holds its CUDA build of PyTorch
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/engine${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
"$py" -c "import torch, transformers, peft, pydantic
print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__,
      'pydantic', pydantic.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
out=${OUT:-/tmp}
# 989 TFLOP/s: the dense bf16 datasheet peak of an H100 SXM and of an H200, for MFU beside the probe's
"$py" bench/gpu_bench.py --peak-tflops 989 --out "$out/gpu_bench.json" "$@"
