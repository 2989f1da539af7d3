#!/usr/bin/env bash
# PS goodput against raw TCP over a REAL shaped link: two network namespaces joined by a veth pair, each end shaped
# with `tc ... tbf` (default 1gbit). Needs root and iproute2 (+ iperf3 for the iperf3 reference column).
# Every address lives only inside the namespaces created here; they are deleted on exit, whatever happens.
#
#   sudo bench/ps/netns_bench.sh [BUILD_DIR] [RATE] [MIB_PER_SIZE]      e.g. bench/ps/netns_bench.sh build 1gbit 128
set -euo pipefail

BUILD=${1:-build}
RATE=${2:-1gbit}
MIB=${3:-128}
BIN="$BUILD/bench/ps/ps_goodput"
[[ -x "$BIN" ]] || { echo "netns_bench: $BIN not found (build the ps_goodput target)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "netns_bench: needs root (network namespaces)" >&2; exit 2; }

source "$(dirname "$0")/../netns_link.sh"
PIDS=()

cleanup() {
  netns_stop_pids
  netns_link_down
}
trap cleanup EXIT INT TERM

# Shaped both directions: push_pull uses both (pushes one way, sums the other). Sets NA NB A B.
netns_link_up csps 213 "$RATE"

echo "# link: veth between namespaces, tbf $RATE each direction; $MIB MiB per measurement"

IPERF=""
if command -v iperf3 >/dev/null; then
  ip netns exec "$NB" iperf3 -s -1 -B "$B" -p 5201 >/dev/null 2>&1 &
  PIDS+=($!)
  sleep 0.5
  IPERF=$(ip netns exec "$NA" iperf3 -c "$B" -p 5201 -t 5 -f m 2>/dev/null | awk '/sender/ {print $(NF-3)}')
  echo "# iperf3 one-way: ${IPERF} Mbit/s = $(awk -v m="$IPERF" 'BEGIN{printf "%.1f", m/8*1e6/1e6}') MB/s"
fi

ip netns exec "$NB" "$BIN" raw-server --bind "$B" --port 5301 &
PIDS+=($!)
RAW=$(ip netns exec "$NA" "$BIN" raw-client --root "$B" --port 5301 --mib-per-size "$MIB")

export COMMSCHED_SECRET="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"  # beyond loopback: authenticate
ip netns exec "$NB" env COMMSCHED_TIMEOUT=30 "$BIN" ps-server --bind "$B" --port 5302 2>/dev/null &
PIDS+=($!)
PS=$(ip netns exec "$NA" env COMMSCHED_TIMEOUT=30 "$BIN" ps-worker --root "$B" --port 5302 --mib-per-size "$MIB" 2>/dev/null)

echo "| partition | PS push_pull MB/s | raw echo MB/s | raw one-way MB/s | PS / raw echo | PS / raw one-way |"
echo "|---|---|---|---|---|---|"
# Rows in the PS output's order (64 KiB .. 64 MiB), raw columns looked up by partition size.
awk -F'|' 'NR == FNR { if ($2 ~ /[0-9]/) { echo[$2] = $3; one[$2] = $4 } next }
           $2 ~ /[0-9]/ { printf "|%s| %.1f | %.1f | %.1f | %.2f | %.2f |\n", $2, $3, echo[$2], one[$2], $3 / echo[$2], $3 / one[$2] }' \
  <(echo "$RAW") <(echo "$PS")
