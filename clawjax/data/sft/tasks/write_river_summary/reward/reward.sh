#!/usr/bin/env bash
# Entry point, run from the workspace after the agent exited: the last stdout line is the reward,
# the plain mean of the sub-scores check.py prints.
set -euo pipefail
python3 reward/check.py "$PWD" | python3 -c 'import json, sys; d = json.load(sys.stdin); print(sum(float(v) for v in d.values()) / len(d))'
