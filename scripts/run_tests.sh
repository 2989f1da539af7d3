#!/usr/bin/env bash
# README command (2): set everything up, then run the whole test suite: every GoogleTest suite through CTest, the
# Python tests. Fails when any test fails. The ThreadSanitizer build of the scheduler's, the collective negotiator's
# and the parameter server's unit tests is separate: scripts/tsan.sh.
# GPU and RDMA tests skip (with a message) on machines without the hardware; GTEST_SKIP is reported as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
echo "== unit and integration tests (ctest)"
(cd build && ctest --output-on-failure --timeout 300)
# The Python suite runs twice: on Debian's torch 1.13 (/usr/bin/python3) and in the test venv on a current torch 2.x
# with tensorflow-cpu and Ray (scripts/test_venv.sh makes it once and caches it). A test that needs what one
# interpreter lacks skips with a message there and runs under the other.
echo "== python tests on Debian's torch ($(/usr/bin/python3 -c 'import torch; print(torch.__version__)'))"
PYTHONPATH="$PWD/build/python" /usr/bin/python3 -m pytest -q --durations=8 tests/python
venv_python=$(./scripts/test_venv.sh)
echo "== python tests on torch $("$venv_python" -c 'import torch; print(torch.__version__)') (test venv)"
PYTHONPATH="$PWD/build/python" "$venv_python" -m pytest -q --durations=8 tests/python
if [[ ${COMMSCHED_SKIP_PIP_SMOKE:-0} != 1 ]]; then
  echo "== packaging: pip install . into a fresh venv, smoke run (COMMSCHED_SKIP_PIP_SMOKE=1 skips it)"
  ./tests/packaging/pip_smoke.sh
fi
echo "== all tests passed"
