#!/usr/bin/env bash
# ThreadSanitizer build of the scheduler's unit tests (engine, policies, loopback backend, timeline), the collective
# negotiator's (collective_unit_test: ranks as threads over loopback sockets) and the parameter server's
# (ps_unit_tests: server, sum engine, ZeroMQ and UCX transports, reply queue), in build-tsan/. Stops at the first
# report. Every test, integration included, under TSan and ASan: scripts/sanitize.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -G Ninja -DCOMMSCHED_SANITIZE=thread -DCOMMSCHED_BUILD_PYTHON=OFF >/dev/null
cmake --build build-tsan -j"$(nproc)" --target scheduler_tests collective_unit_test ps_unit_tests
# Debian's oneTBB, libzmq and libsodium are not built with TSan: their own synchronisation is invisible to it, so
# their internals are suppressed (see the files); our code is not.
SUPP=$(mktemp)
trap 'rm -f "$SUPP"' EXIT
cat scripts/tsan.supp tests/integration/ps/tsan.supp >"$SUPP"
# UCX_MEM_MMAP_HOOK_MODE=none: libucm's madvise hook otherwise runs at every thread exit inside TSan's torn-down
# thread state and segfaults (scripts/sanitize.sh says more).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$SUPP" UCX_MEM_MMAP_HOOK_MODE=none
for t in scheduler/scheduler_tests collective/collective_unit_test ps/ps_unit_tests; do
  echo "== $t"
  "./build-tsan/tests/unit/$t" --gtest_brief=1
done
