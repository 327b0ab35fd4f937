#!/usr/bin/env bash
# The accelerator check on a lent machine as it comes: its own Python and packages (jax with its CUDA
# plugin, torch, transformers), nothing installed from a registry, no venv. What its image lacks of
# clawjax's dependencies travels as wheels in `.whl/` (git-ignored; `bash scripts/device_wheels.sh`
# downloads them here, and the call that runs this carries the folder), installed into a folder of their
# own that goes first on PYTHONPATH. Then scripts/device_check.py runs each part in its own process under
# its own time limit (505 s in all by default: the whole fits one 10-minute command) and, after each,
# rewrites OUT/device_check.json (the report) and OUT/parts.tar.gz (each part's JSON and log).
#
#   bash scripts/device_check.sh --out OUT [--small] [--parts NAME ...] [--deadline-s S]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
SITE=""
# --small runs on this machine's own interpreter (the CPU test): the wheels are for the lent one's.
if [[ " $* " != *" --small "* ]] && compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  SITE="${TMPDIR:-/tmp}/clawjax-device-site"
  rm -rf "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$ROOT"/.whl/*.whl \
    || { echo "[device_check] installing the carried wheels failed; the parts will say what is missing" >&2; SITE=""; }
fi
export PYTHONPATH="${SITE:+$SITE:}$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec "$PY" "$ROOT/scripts/device_check.py" "$@"
