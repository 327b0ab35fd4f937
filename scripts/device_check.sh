#!/usr/bin/env bash
# The accelerator check for when a GPU machine is lent (an H200, ~10 minutes, nothing reachable but the
# package registries): installs what it needs, then scripts/device_check.py measures the learner's MFU
# (8K and 32K-token rows, tree vs paths), the Pallas kernel against "blocked", the embedded engine's
# decode and real SGLang (log-probs against the learner's, one /update_weights_from_disk push), and
# writes one JSON. Every step's failure is recorded in that JSON and the check goes on.
#
#   bash scripts/device_check.sh [--out FILE] [--small] [--parts learner_mfu pallas engine_decode sglang]
#
# Installs, cached in $CLAWJAX_CACHE/device_check (a venv is rebuilt only when what it was built from
# changes): clawjax's dependencies at third_party/python/constraints.txt plus jax's CUDA 12 plugin of the
# same version; SGLang's CUDA build from third_party/sglang-cuda/requirements.txt (every wheel hashed),
# in the background while the JAX parts run. --small: no installs (this interpreter), tiny sizes on the
# CPU, SGLang skipped: what tests/benchmarks/test_device_check.py runs.
set -uo pipefail  # no -e: a failed step is recorded, not fatal
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT=device_check.json
SMALL=0
ARGS=()
while (($#)); do
  case $1 in
    --out) OUT=$2; shift ;;
    --small) SMALL=1; ARGS+=(--small) ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
WORK="${OUT%.json}_work"
mkdir -p "$WORK/install"
# The whole check's seconds (the lease has ~10 minutes; the rest is the machine's start and the copy).
DEADLINE_S=${DEVICE_CHECK_DEADLINE_S:-560}

if ((SMALL)); then
  exec "${PYTHON:-python}" scripts/device_check.py "${ARGS[@]}" --out "$OUT" --workdir "$WORK" \
    --install-dir "$WORK/install" --deadline-s "$DEADLINE_S"
fi

CACHE="${CLAWJAX_CACHE:-$HOME/.cache/clawjax}/device_check"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE"

# install NAME VENV STAMP LIMIT_S PIP_ARGS...: a venv built once per STAMP; writes $WORK/install/NAME.json.
install() {
  local name=$1 venv=$2 stamp=$3 limit=$4 start=$SECONDS status
  shift 4
  if [[ -f "$venv/.stamp" && "$(cat "$venv/.stamp")" == "$stamp" ]]; then
    status=cached
  else
    rm -rf "$venv"
    if "$PY" -m venv "$venv" && timeout "$limit" "$venv/bin/pip" install -q "$@" >"$WORK/install/$name.log" 2>&1; then
      echo "$stamp" >"$venv/.stamp"
      status=installed
    else
      status=failed
    fi
  fi
  printf '{"status": "%s", "seconds": %d, "python": "%s", "log": "%s"}\n' "$status" $((SECONDS - start)) \
    "$("$PY" -c 'import sys; print(sys.version.split()[0])')" "$WORK/install/$name.log" >"$WORK/install/$name.json"
}

JAX_VERSION=$(sed -n 's/^jax==//p' third_party/python/constraints.txt)
JAX_STAMP=$(cat setup.py third_party/python/constraints.txt scripts/device_check.sh | sha256sum | cut -d' ' -f1)
SGLANG_LOCK=third_party/sglang-cuda/requirements.txt
SGLANG_STAMP=$(sha256sum "$SGLANG_LOCK" | cut -d' ' -f1)

# SGLang (several GB of CUDA wheels) installs meanwhile; the driver waits for its NAME.json.
install sglang "$CACHE/venv-sglang" "$SGLANG_STAMP" 300 --require-hashes --no-deps --only-binary=:all: \
  -r "$SGLANG_LOCK" &
install jax "$CACHE/venv-jax" "$JAX_STAMP" 150 -c third_party/python/constraints.txt -e . \
  "jax[cuda12]==$JAX_VERSION"
JAX_PY="$CACHE/venv-jax/bin/python"
[[ -x "$JAX_PY" ]] || JAX_PY="$PY"  # its parts then fail, recorded; the JSON is written all the same
"$JAX_PY" scripts/device_check.py "${ARGS[@]}" --out "$OUT" --workdir "$WORK" \
  --install-dir "$WORK/install" --deadline-s $((DEADLINE_S - SECONDS)) \
  --sglang-python "$CACHE/venv-sglang/bin/python"
rc=$?
wait
exit $rc
