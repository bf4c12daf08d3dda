#!/usr/bin/env bash
# The builtin GRPO trainer on CUDA vs CPU (issue 12, item 5). Needs only this repo + torch on the
# machine; anything else missing is installed OFFLINE from tmp/rl_wheels (prepare it here with
# `bash benchmarks/rl_gpu_wheels.sh` and carry tmp/rl_wheels along). Usage:
#   bash benchmarks/rl_gpu_check.sh [STEPS] [extra args of rl_gpu_check.py]   (default 3 steps per device)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STEPS=${1:-3}
shift || true
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
MISSING=$($PY benchmarks/rl_gpu_check.py --missing)
if [ -n "$MISSING" ]; then
  if [ -d tmp/rl_wheels ]; then
    echo "installing offline from tmp/rl_wheels: $MISSING"
    $PY -m pip install -q --no-index --find-links tmp/rl_wheels $MISSING
  else
    echo "missing packages: $MISSING; no tmp/rl_wheels to install them from (see benchmarks/rl_gpu_wheels.sh)" >&2
    exit 3
  fi
fi
# the package itself, from this copy; PYTHONPATH as well, so the served child finds it even if
# the editable install cannot build offline
$PY -m pip install -q -e . --no-deps --no-build-isolation 2>/dev/null || echo "(editable install skipped; using PYTHONPATH=src)"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
$PY benchmarks/rl_gpu_check.py --steps "$STEPS" "$@"
