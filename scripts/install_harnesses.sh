#!/usr/bin/env bash
# Installs the real agent harnesses (Claude Code, OpenClaw + Node 24, Codex) from the npm registry into the
# clawjax cache ($CLAWJAX_CACHE, default ~/.cache/clawjax/harnesses), from their locks in third_party/; a
# second run does nothing. With --relock NAME: re-resolve a harness and rewrite its lock instead.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec python -m clawjax.harness.install "$@"
