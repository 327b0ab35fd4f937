#!/usr/bin/env bash
# README command two: set up on first use, then run the test suite (slow integration tests included).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec python -m pytest "$@"
