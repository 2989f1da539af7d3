#!/usr/bin/env bash
# Network faults on REAL links (issue 17, item 6): 1 server and 3 workers of the parameter server, each in its own
# network namespace on a bridge (bench/netns_link.sh, links shaped with tbf), authenticated with a fresh secret.
# Once every worker is looping, worker 2's link is either taken DOWN (both ends) or slowed to a CRAWL (tbf 8kbit);
# the survivors must fail naming the peer they lost within COMMSCHED_TIMEOUT plus slack, and no process may be left.
# Needs root. Every namespace made here is deleted on exit.
#
#   scripts/netfault.sh [down|crawl|both] [BUILD_DIR]        (default: both, ./build)
set -euo pipefail
MODE=${1:-both}
BUILD=${2:-build}
[[ $(id -u) == 0 ]] || { echo "netfault: needs root (network namespaces)" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=$HERE/$BUILD/tests/integration/ps/ps_test_worker
[[ -x $BIN ]] || { echo "netfault: build $BIN first (scripts/build.sh)" >&2; exit 2; }
source "$HERE/bench/netns_link.sh"
TIMEOUT_S=4        # COMMSCHED_TIMEOUT: silence before a peer is declared dead
SLACK_S=6          # detection granularity, spreading peer_lost, process exit
VICTIM=3           # host index of worker 2 (host 0 is the server)
PIDS=()
NAMES=()
cleanup() {
  netns_stop_pids KILL
  netns_star_down
}
trap cleanup EXIT INT TERM

trial() {
  local fault=$1 dir
  dir=$(mktemp -d)
  netns_star_up cnf 217 4 1gbit
  local sw_port="cnf$$p$VICTIM" root=${STAR_ADDRS[0]}
  local envs=(COMMSCHED_SECRET="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')" COMMSCHED_NUM_WORKERS=3
              COMMSCHED_NUM_SERVERS=1 COMMSCHED_ROOT_ADDR="$root" COMMSCHED_ROOT_PORT=29710
              COMMSCHED_TIMEOUT=$TIMEOUT_S COMMSCHED_PS_HEARTBEAT=250ms)
  PIDS=() NAMES=()
  ip netns exec "${STAR_HOSTS[0]}" env "${envs[@]}" COMMSCHED_ROLE=server COMMSCHED_RANK=0 \
    COMMSCHED_BIND="$root" "$BIN" >"$dir/server0.log" 2>&1 &
  PIDS+=($!) NAMES+=("server 0")
  for w in 0 1 2; do
    local h=$((w + 1))
    ip netns exec "${STAR_HOSTS[h]}" env "${envs[@]}" COMMSCHED_ROLE=worker COMMSCHED_RANK=$w \
      COMMSCHED_BIND="${STAR_ADDRS[h]}" "$BIN" --tensors 20 --max-bytes 2000000 --mode loop \
      --ready "$dir/ready$w" >"$dir/worker$w.log" 2>&1 &
    PIDS+=($!) NAMES+=("worker $w")
  done
  for w in 0 1 2; do
    local i=0
    while [[ ! -e $dir/ready$w ]] && ((i++ < 600)); do sleep 0.05; done
    [[ -e $dir/ready$w ]] || { echo "netfault: worker $w never became ready"; tail -n 5 "$dir"/*.log; return 1; }
  done
  local t0
  t0=$(date +%s%3N)
  if [[ $fault == down ]]; then
    ip -n "$STAR_SWITCH" link set "$sw_port" down
    ip -n "${STAR_HOSTS[VICTIM]}" link set eth0 down
  else
    ip netns exec "$STAR_SWITCH" tc qdisc change dev "$sw_port" root tbf rate 8kbit burst 2kb latency 10s
    ip netns exec "${STAR_HOSTS[VICTIM]}" tc qdisc change dev eth0 root tbf rate 8kbit burst 2kb latency 10s
  fi
  local limit ok=1
  limit=$((t0 + (TIMEOUT_S + SLACK_S) * 1000))
  for i in "${!PIDS[@]}"; do
    local p=${PIDS[i]} name=${NAMES[i]}
    while kill -0 "$p" 2>/dev/null && (($(date +%s%3N) < limit)); do sleep 0.05; done
    if kill -0 "$p" 2>/dev/null; then
      echo "  $fault: $name still running $((TIMEOUT_S + SLACK_S)) s after the fault: FAIL"
      ok=0
      continue
    fi
    local rc=0
    wait "$p" || rc=$?
    local took
    took=$(($(date +%s%3N) - t0))
    local log="$dir/${name/ /}.log" named="names no peer"
    if [[ $name == "worker 2" ]]; then
      grep -q "server 0" "$log" && named="names server 0"
    else
      grep -q "worker 2" "$log" && named="names worker 2"
    fi
    printf "  %s: %-9s exited %3d after %d.%03d s, %s\n" "$fault" "$name" "$rc" $((took / 1000)) $((took % 1000)) "$named"
    [[ $rc != 0 ]] || ok=0
    [[ $named != "names no peer" ]] || ok=0
  done
  local left=0
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && left=$((left + 1)); done
  echo "  $fault: processes left behind: $left"
  ((left == 0)) || ok=0
  if ((ok == 0)); then
    for f in "$dir"/*.log; do echo "---- $f"; tail -n 4 "$f"; done
  fi
  rm -rf "$dir"
  netns_star_down
  STAR_HOSTS=() STAR_VETHS=() STAR_SWITCH=""
  ((ok == 1))
}

status=0
case $MODE in
  down | crawl) trial "$MODE" || status=1 ;;
  both) trial down || status=1; trial crawl || status=1 ;;
  *) echo "netfault: mode must be down, crawl or both" >&2; exit 2 ;;
esac
((status == 0)) && echo "netfault: PASS" || echo "netfault: FAIL"
exit $status
