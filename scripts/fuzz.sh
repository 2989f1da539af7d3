#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang-14 with -fsanitize=fuzzer,address,undefined) and runs each for
# SECONDS (default 600) under `nice`, starting from the committed seed corpora. New interesting inputs go to
# build-fuzz/corpus/<target>/ (not committed); crashes go to build-fuzz/crashes/<target>/. Exits non-zero when any
# target found a crash or a sanitizer report: copy the input to tests/fuzz/regressions/<target>/ and fix the code;
# the normal test suite (tests/unit/fuzz) replays every file there.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#     targets: ps_header collective_wire config profile_json stragglers link_auth node_link
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-600}
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(ps_header collective_wire config profile_json stragglers link_auth node_link)
CXX=${FUZZ_CXX:-clang++-14}
cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER="$CXX" >/dev/null
nice -n 10 cmake --build build-fuzz
status=0
for t in "${TARGETS[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  log="build-fuzz/fuzz_$t.log"
  echo "== fuzz_$t for ${SECONDS_PER_TARGET}s (log: $log)"
  # -rss_limit_mb: a decoder that allocates what a hostile length field asks for is a finding, not a slow run.
  if ! UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 nice -n 10 "./build-fuzz/fuzz_$t" \
      -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -max_len=65536 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/crashes/$t/" "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    echo "   CRASH or sanitizer report: see $log and build-fuzz/crashes/$t/"
    status=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|^#[0-9]+ *DONE" "$log" | sed 's/^/   /' || true
done
exit $status
