#!/usr/bin/env bash
# ThreadSanitizer build of the scheduler's unit tests (engine, policies, loopback backend, timeline).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -G Ninja -DCOMMSCHED_SANITIZE=thread -DCOMMSCHED_BUILD_PYTHON=OFF >/dev/null
cmake --build build-tsan -j"$(nproc)" --target scheduler_tests
# oneTBB's own synchronisation is not instrumented in Debian's build; its internals are suppressed, our code is not.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp" \
  ./build-tsan/tests/unit/scheduler/scheduler_tests --gtest_brief=1
