#!/usr/bin/env bash
# The package as a wheel user gets it: CI installs the checkout editable, which would hide a wheel that lacks its
# configs. Builds the wheel from the checkout's files, installs it into a fresh venv (CPU torch first, as README.md
# says), then from an empty directory runs a training, a study (a tiny MLP and an n-gram, two at a time, ending in
# its report), nplm-report and nplm-bench on a slice of Brown (../shared/data/brown.zip, else the tiny synthetic
# corpus) into a SQLite store there. Any failure stops it with the step that failed and a non-zero exit.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
trap 'echo "wheel check FAILED: $STEP" >&2' ERR
STEP=setup
step() { STEP="$1"; echo "== [${SECONDS} s] $1"; }

CORPUS="${NPLM_SHARED:-$ROOT/../shared}/data/brown.zip"
[ -f "$CORPUS" ] || CORPUS="$ROOT/tests/data/tiny_brown.zip"
SLICE=(data.split.train=6000 data.split.valid=2000 data.split.test=2000)
RUN="$WORK/run"
mkdir "$WORK/src" "$RUN"
export NPLM_CACHE="$WORK/cache"
unset MLFLOW_TRACKING_URI

step "wheel of the checkout's files (tracked and new, not ignored), built outside the checkout"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
python3.11 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
rm -rf "$WORK/src"

step "install: torch==2.13.0 (CPU) first, then the wheel, its dependencies at the lock's versions"
"$WORK/venv/bin/pip" install -q torch==2.13.0
"$WORK/venv/bin/pip" install -q -c "$ROOT/requirements.lock" "$WORK"/dist/nplm_repro-*.whl
BIN="$WORK/venv/bin"

cd "$RUN"
step "the package and its configs come from the wheel"
"$BIN/python" -c "import nplm_repro.conf as c, sys; sys.exit(not c.__file__.startswith('$WORK/venv/'))"
"$BIN/nplm-train" --help | grep "^study: .*brown_table1"

step "nplm-train experiment=kn3 from an empty directory"
"$BIN/nplm-train" experiment=kn3 "data.path=$CORPUS" "${SLICE[@]}" "tracking.uri=sqlite:///$RUN/mlflow.db"

step "nplm-train -m study=brown_table1 (MLP3 for 5 batches and Kneser-Ney n=3, two at a time)"
"$BIN/nplm-train" -m study=brown_table1 experiment=mlp3,kn3 trainer.max_epochs=1 trainer.limit_train_batches=5 \
    trainer.enable_progress_bar=false "data.path=$CORPUS" "${SLICE[@]}" "tracking.uri=sqlite:///$RUN/mlflow.db"
grep -q "MLP3" reports/brown_table1.md

step "nplm-report --study brown_table1 on that store"
"$BIN/nplm-report" --study brown_table1 --tracking-uri "sqlite:///$RUN/mlflow.db" --out "$RUN/again"
grep -q "Kneser-Ney back-off" again/brown_table1.md

step "nplm-bench (conf/bench.yaml) counting Kneser-Ney n=3"
"$BIN/nplm-bench" "bench.what=[ngram]" "bench.ngram_rows=[kn3]" "data.path=$CORPUS" "${SLICE[@]}" | grep '"what": "ngram kn3"'

echo "wheel check passed in ${SECONDS} s"
