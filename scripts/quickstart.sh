#!/usr/bin/env bash
# README command one: set up on first use, then run the CPU quickstart: a toy policy in the embedded JAX
# engine, trained with GRPO behind the mini harness on tasks scored by real checkers (~10 min, 2 cores).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# Rollouts run in bubblewrap where it works (sandbox mode "auto"; each rollout record says which).
ensure_bubblewrap
exec python experiments/train.py --config=configs/quickstart.py --workdir=runs/quickstart "$@"
