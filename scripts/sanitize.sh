#!/usr/bin/env bash
# Every GoogleTest suite (unit and integration: the PS and Gloo multi-process tests included) built and run under
#   address: AddressSanitizer + UndefinedBehaviorSanitizer (build-asan), and
#   thread:  ThreadSanitizer (build-tsan).
# Helper processes the integration tests spawn (ps_test_worker, gloo_rank_main, the launcher) are instrumented too;
# a sanitizer report in any of them makes it exit non-zero and its test fail. The Python tests are not run here (the
# interpreter is not instrumented). Too slow for CI on small machines: run by hand; results go in bench/RESULTS.md.
#   scripts/sanitize.sh [address|thread|both] [ctest args...]     (default both)
set -euo pipefail
cd "$(dirname "$0")/.."
WHICH=${1:-both}
shift || true
SUPP=$(mktemp)
trap 'rm -f "$SUPP"' EXIT
# libzmq and libtbb from Debian are not instrumented: their internal hand-offs are invisible to TSan (see the files).
cat scripts/tsan.supp tests/integration/ps/tsan.supp >"$SUPP"
status=0
# UCX_MEM_MMAP_HOOK_MODE=none: libucm (linked in whenever UCX is built in) patches madvise/mmap; under TSan a thread's
# exit then runs ucm's hook inside TSan's torn-down thread state and segfaults (every multi-threaded test, no report).
# Only UCX's registration cache uses those events; the sanitizer runs do not need it.
run() {
  local kind=$1 dir=$2
  shift 2
  echo "== $kind: configure and build $dir"
  cmake -S . -B "$dir" -G Ninja -DCOMMSCHED_SANITIZE="$kind" -DCOMMSCHED_BUILD_PYTHON=OFF -DCOMMSCHED_BUILD_BENCH=OFF \
    >/dev/null
  nice -n 10 cmake --build "$dir" -j"$(nproc)"
  echo "== $kind: ctest"
  (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$SUPP" COMMSCHED_TEST_TIME_SCALE=4 \
     UCX_MEM_MMAP_HOOK_MODE=none \
     ctest --output-on-failure --timeout 900 "$@") || status=1
}
case $WHICH in
  address) run address build-asan "$@" ;;
  thread) run thread build-tsan "$@" ;;
  both) run address build-asan "$@"; run thread build-tsan "$@" ;;
  *) echo "sanitize: address, thread or both" >&2; exit 2 ;;
esac
exit $status
