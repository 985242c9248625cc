#!/usr/bin/env bash
# The Python packages bench/gpu_bench.py needs that a lent device machine's image lacks, or holds in
# other versions (pydantic is missing there; transformers and peft differ), downloaded as wheels for
# its Python 3.12 into .whl/ (git-ignored), in the versions this checkout's engine is tested with.
# `make gpu-wheels` runs it; bench/gpu_device.sh installs them there. See engine/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
version() { "$py" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1"; }
pins=()
for name in pydantic pydantic_core annotated-types typing-inspection typing_extensions transformers peft; do
  pins+=("$name==$(version "$name")")
done
rm -rf .whl.partial && mkdir -p .whl.partial
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl.partial "${pins[@]}"
rm -rf .whl && mv .whl.partial .whl  # all or nothing: a half-downloaded set never replaces a whole one
echo "gpu wheels in .whl: ${pins[*]} ($(du -sh .whl | cut -f1))"
