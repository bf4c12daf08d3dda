#!/usr/bin/env bash
# Download (here, online) the wheels benchmarks/rl_gpu_check.sh may need on an offline GPU machine
# into tmp/rl_wheels (git-ignored; carry it). PYVER: the GPU machine's python (default: ours).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PYVER=${PYVER:-$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')}
mkdir -p tmp/rl_wheels
pkgs=()
for p in transformers tokenizers safetensors huggingface_hub aiohttp pydantic orjson pyyaml typer rich tenacity jinja2 httpx; do
  v=$($PY -c "import importlib.metadata as m; print(m.version('$p'))")
  pkgs+=("$p==$v")
done
$PY -m pip download -q --only-binary=:all: --python-version "$PYVER" --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any -d tmp/rl_wheels "${pkgs[@]}"
du -sh tmp/rl_wheels
