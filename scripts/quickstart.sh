#!/usr/bin/env bash
# README command one: set up on first use, then run the CPU main job.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec python -m clawjax.tree summarize clawjax/data/sample_calls.jsonl "$@"
