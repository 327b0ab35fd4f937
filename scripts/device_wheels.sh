#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels that a lent GPU machine's image lacks of clawjax's
# dependencies, for its Python (3.12, x86-64 Linux): third_party/device/wheels.txt, every wheel hashed.
# The machine reaches no registry; scripts/device_check.sh installs these there from the carried folder.
#
#   bash scripts/device_wheels.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rm -rf "$ROOT/.whl"
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --require-hashes \
  --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 \
  -d "$ROOT/.whl" -r "$ROOT/third_party/device/wheels.txt"
du -sh "$ROOT/.whl"
