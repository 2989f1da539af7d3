#!/usr/bin/env bash
# README command (2): set everything up, then run the whole test suite: every GoogleTest suite through CTest, the
# Python tests, and the ThreadSanitizer build of the scheduler's unit tests. Fails when any test fails.
# GPU and RDMA tests skip (with a message) on machines without the hardware; GTEST_SKIP is reported as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
echo "== unit and integration tests (ctest)"
(cd build && ctest --output-on-failure --timeout 300)
echo "== python tests"
PYTHONPATH="$PWD/build/tuner" /usr/bin/python3 -m pytest -q tests/python
echo "== ThreadSanitizer: scheduler unit tests"
./scripts/tsan.sh
echo "== all tests passed"
