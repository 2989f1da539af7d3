#!/usr/bin/env bash
# Two `commsched launch` nodes as two hosts: network namespaces joined by a veth pair (bench/netns_link.sh, 1 Gbit/s
# tbf), node 0 at address A, node 1 at B, sharing a fresh COMMSCHED_SECRET. Needs root. Prints each node's output and exits with the first failure.
#   netns_two_nodes.sh COMMSCHED_BIN WORKERS SERVERS -- worker command...
# NETNS_LAUNCH_ARGS: more `commsched launch` options for both nodes (e.g. "--min-workers 2").
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/bench/netns_link.sh"
trap netns_link_down EXIT INT TERM
bin=$1 workers=$2 servers=$3
shift 4
netns_link_up csl 77 1gbit
port=29400  # fresh namespaces: every port is free
# A multi-node run shares one secret through the environment of every node (binding beyond loopback requires it; the
# launchers never send it over their link).
COMMSCHED_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export COMMSCHED_SECRET
log1=$(mktemp)
ip netns exec "$NB" "$bin" launch --nnodes 2 --node-rank 1 --root "$A:$port" -w "$workers" -s "$servers" \
  --join-timeout 30 ${NETNS_LAUNCH_ARGS:-} -- "$@" >"$log1" 2>&1 &
pid1=$!
ip netns exec "$NA" "$bin" launch --nnodes 2 --node-rank 0 --root "$A:$port" -w "$workers" -s "$servers" \
  --join-timeout 30 ${NETNS_LAUNCH_ARGS:-} -- "$@" 2>&1 | sed 's/^/node0| /'
rc0=${PIPESTATUS[0]}
wait "$pid1"
rc1=$?
sed 's/^/node1| /' "$log1"
rm -f "$log1"
echo "node0 rc=$rc0 node1 rc=$rc1"
[[ $rc0 -eq 0 && $rc1 -eq 0 ]]
