#!/usr/bin/env bash
# Re-resolves clawjax's own Python dependencies (the newest versions setup.py's ranges allow) in a
# throwaway venv and rewrites third_party/python/constraints.txt with what it installed; the next
# scripts/env.sh then reinstalls .venv with them.
set -euo pipefail
OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/third_party/python/constraints.txt"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
CLAWJAX_VENV="$TMP/venv" CLAWJAX_UNCONSTRAINED=1 source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
{
  sed -n '/^#/p' "$OUT"  # the header stays
  # A local version label (torch's +cpu) is dropped: a machine without the local wheel takes PyPI's build.
  "$TMP/venv/bin/pip" freeze --all --exclude-editable | grep -v '^#' | sed -E 's/^([^=]+==[^+]+)\+.*/\1/'
} > "$TMP/constraints.txt"
mv "$TMP/constraints.txt" "$OUT"
echo "$OUT"
