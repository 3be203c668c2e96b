#!/usr/bin/env bash
# Create .venv and install grader with its test, vLLM and Ray extras. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
# torch first and pinned: on CPU machines this is the local CPU wheel, not gigabytes of CUDA.
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install -e ".[dev,vllm,ray]"
# vllm 0.32.0 pulls torchvision, torchaudio and torchcodec built against CUDA torch; next to a
# CPU torch they break `import vllm.*`. Only a CPU machine drops them.
if .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "setup done: $(.venv/bin/grader --version)"
