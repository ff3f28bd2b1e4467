#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (docs/scaling.md has its last results).
# On a machine with an NVIDIA GPU and only this repository (plus Brown at $NPLM_SHARED/data/brown.zip, default
# ../shared/data/brown.zip beside it), in under 8 minutes:
#   1. install: a venv (.cache/gpu_check/venv, kept for the next run) with a torch that sees the GPU, and the project;
#   2. the CUDA tests of tests/test_speed.py, which skip without a GPU (here a skip is a failure);
#   3. one epoch of MLP9 on full Brown on the GPU and the same epoch on the CPU, same seed, both in 32-true (the CPU
#      run in the background while the tests run): train, valid and test perplexity within 1%, the tests' tolerance
#      for the same command on GPU and CPU (bf16-mixed on the GPU is what the CUDA tests compare, on a slice);
#   4. nplm-bench experiment=mlp9, the train lines 32-true, bf16-mixed and auto, and sampled, on the GPU, last, on a
#      quiet machine (rounds of 2 s: a GPU step takes milliseconds, so a round is still thousands of steps).
# Prints one JSON object per line on stdout ({"check": ..., "ok": ...}, the bench's own lines with "check": "bench"),
# the last one the verdict; each step's output is in .cache/gpu_check/logs/. Exits 1 if any check failed (it runs the
# others all the same), 2 when it cannot start (no Brown, no Python). Without a GPU it says so in one line and exits 0,
# before installing anything.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
START=$SECONDS

# 0. Is there a GPU? nvidia-smi answers without any Python package, so nothing is installed on a machine without one.
no_gpu() {
    echo "{\"check\": \"gpu\", \"ok\": true, \"skipped\": \"no NVIDIA GPU here ($1): nothing to check\"}"
    exit 0
}
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi is not installed"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)" || no_gpu "nvidia-smi finds none"
[ -n "$GPU" ] || no_gpu "nvidia-smi finds none"

PY="$(command -v python3.11 || command -v python3)" || {
    echo '{"check": "python", "ok": false, "error": "neither python3.11 nor python3 is on PATH"}'
    exit 2
}
emit() { # emit key value ...: one JSON line; a value that parses as JSON (numbers, true, lists) is kept as such
    "$PY" -c '
import json, sys
def value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text
print(json.dumps({k: value(v) for k, v in zip(sys.argv[1::2], sys.argv[2::2])}), flush=True)' "$@"
}
last_line() { grep -v '^\s*$' "$1" | tail -n 1; }

export NPLM_SHARED="${NPLM_SHARED:-$ROOT/../shared}" # where the tests look for Brown too
BROWN="$NPLM_SHARED/data/brown.zip"
[ -f "$BROWN" ] || {
    emit check data ok false error "Brown not found at $BROWN: set NPLM_SHARED to the folder whose data/ holds brown.zip"
    exit 2
}
STATE="$ROOT/.cache/gpu_check"
VENV="$STATE/venv"
LOGS="$STATE/logs"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
rm -rf "$LOGS"
mkdir -p "$LOGS"
export NPLM_CACHE="$WORK/cache"
unset MLFLOW_TRACKING_URI
FAILED=()

# 1. install. Torch: a CUDA build, never the CPU build 2.13.0 that README.md's first command and .ci/run install
# (pip's config on a CPU machine may point `torch==2.13.0` at it). A Python whose torch already sees the GPU (a GPU
# image's) lends it to the venv through a .pth file: no download of its GBs, and its CUDA matches the driver. Else
# `pip install torch==2.13.0` from PyPI, whose Linux x86_64 wheel is the CUDA build (another CUDA version: the
# selector on PyTorch's website). Offline, pip reads PIP_NO_INDEX=1 and PIP_FIND_LINKS=<folder of wheels>.
export PY VENV SEES_GPU='import sys, torch; sys.exit(not torch.cuda.is_available())'
install() { # run by a bash of its own with -e, which stops at its first failing command
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "$SEES_GPU"; then
        rm -rf "$VENV"
        "$PY" -m venv "$VENV"
        if "$PY" -c "$SEES_GPU"; then
            site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
            "$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' >"$site/gpu_torch.pth"
        else
            "$VENV/bin/pip" install torch==2.13.0
        fi
    fi
    "$VENV/bin/pip" install -e . "pytest>=8"
    "$VENV/bin/python" -c "$SEES_GPU"
}
if timeout 360 bash -euo pipefail -c "$(declare -f install); install" >"$LOGS/install.log" 2>&1; then
    TORCH="$("$VENV/bin/python" -c 'import torch; print(torch.__version__, torch.version.cuda)')"
    emit check install ok true gpu "$GPU" torch "${TORCH% *}" cuda "${TORCH#* }" python "$("$VENV/bin/python" -V)" \
        seconds $((SECONDS - START))
else
    emit check install ok false gpu "$GPU" error "$(last_line "$LOGS/install.log")" log "$LOGS/install.log"
    exit 1
fi
BIN="$VENV/bin"

# 3 (started first): the same epoch on the GPU and on the CPU, each into its own store
epoch() { # epoch gpu|cpu [overrides]: one epoch of MLP9 on full Brown in 32-true
    local device="$1"
    shift
    timeout 420 "$BIN/nplm-train" experiment=mlp9 "data.path=$BROWN" trainer.max_epochs=1 trainer.precision=32-true \
        "trainer.accelerator=$device" trainer.enable_progress_bar=false "tracking.uri=sqlite:///$WORK/$device.db" \
        "hydra.run.dir=$WORK/$device" "$@" >"$LOGS/epoch_$device.log" 2>&1
}
CPU_THREADS=$(($(nproc) > 4 ? $(nproc) - 2 : $(nproc))) # the rest for the GPU run's host side and the tests
epoch cpu "threads=$CPU_THREADS" &
CPU_EPOCH=$!
epoch gpu &
GPU_EPOCH=$!

# 2. the CUDA tests (they run their own GPU and CPU trainings on a slice of Brown)
TESTS=(tests/test_speed.py::test_gpu_training_steps_never_wait_for_the_device
    tests/test_speed.py::test_nplm_train_on_gpu_scores_as_on_cpu
    tests/test_speed.py::test_bf16_training_on_gpu_reaches_the_float32_perplexity)
timeout 420 "$BIN/python" -m pytest -p no:cacheprovider -rs "${TESTS[@]}" --junitxml="$LOGS/cuda_tests.xml" \
    >"$LOGS/cuda_tests.log" 2>&1 || true
RESULT="$("$BIN/python" -c '
import json, sys
import xml.etree.ElementTree as ET
try:
    suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
except (OSError, ET.ParseError):
    suite = None
counts = {k: int(suite.get(k, 0)) if suite is not None else 0 for k in ("tests", "failures", "errors", "skipped")}
ok = counts["tests"] > 0 and counts["failures"] + counts["errors"] + counts["skipped"] == 0
print(json.dumps({"check": "cuda_tests", "ok": ok, **counts}))' "$LOGS/cuda_tests.xml")"
echo "$RESULT"
case "$RESULT" in *'"ok": true'*) ;; *) FAILED+=(cuda_tests) ;; esac

# 3 (continued): wait for both epochs, then compare their perplexities
EPOCHS_OK=true
declare -A EPOCH_PIDS=([gpu]=$GPU_EPOCH [cpu]=$CPU_EPOCH)
for device in gpu cpu; do
    if ! wait "${EPOCH_PIDS[$device]}"; then
        emit check "epoch_$device" ok false error "$(last_line "$LOGS/epoch_$device.log")" log "$LOGS/epoch_$device.log"
        EPOCHS_OK=false
        FAILED+=("epoch_$device")
    fi
done
if $EPOCHS_OK && "$BIN/python" -c '
import json, sys
import mlflow

def perplexities(device):
    client = mlflow.MlflowClient(f"sqlite:///{sys.argv[1]}/{device}.db")
    (run,) = client.search_runs([client.get_experiment_by_name("brown").experiment_id])
    return {split: run.data.metrics[f"{split}_ppl"] for split in ("train", "valid", "test")}

gpu, cpu = perplexities("gpu"), perplexities("cpu")
difference = {split: gpu[split] / cpu[split] - 1 for split in gpu}
ok = all(abs(d) <= 0.01 for d in difference.values())
rounded = {k: {s: round(v, 4 if k == "difference" else 2) for s, v in d.items()} for k, d in
           (("gpu", gpu), ("cpu", cpu), ("difference", difference))}
print(json.dumps({"check": "epoch_gpu_against_cpu", "ok": ok, "precision": "32-true", "tolerance": 0.01, **rounded}))
sys.exit(not ok)' "$WORK"; then :; else FAILED+=(epoch_gpu_against_cpu); fi

# 4. the bench on the GPU, alone on the machine
if timeout 300 "$BIN/nplm-bench" experiment=mlp9 "data.path=$BROWN" trainer.accelerator=gpu "bench.what=[train,sampled]" \
    "bench.precisions=[32-true,bf16-mixed,auto]" bench.min_seconds=2 "hydra.run.dir=$WORK/bench" \
    >"$LOGS/bench.jsonl" 2>"$LOGS/bench.log"; then
    "$BIN/python" -c '
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
for line in lines:
    print(json.dumps({"check": "bench", "ok": True, **line}))
expected, found = ["train 32-true", "train bf16-mixed", "train auto", "train sampled"], [l["what"] for l in lines]
if found != expected:
    print(json.dumps({"check": "bench", "ok": False, "error": f"expected the lines {expected}, got {found}"}))
sys.exit(found != expected)' "$LOGS/bench.jsonl" || FAILED+=(bench)
else
    emit check bench ok false error "$(last_line "$LOGS/bench.log")" log "$LOGS/bench.log"
    FAILED+=(bench)
fi

FAILED_JSON="$("$PY" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${FAILED[@]}")"
emit check gpu_check ok "$([ ${#FAILED[@]} -eq 0 ] && echo true || echo false)" gpu "$GPU" failed "$FAILED_JSON" \
    seconds $((SECONDS - START)) logs "$LOGS"
[ ${#FAILED[@]} -eq 0 ]
