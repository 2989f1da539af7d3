# Sourced by the namespace benchmarks (bash): two network namespaces joined by a veth pair, each end shaped with
# `tc ... tbf` (no netem). Every address lives only inside the namespaces; netns_link_down deletes them.
#
#   source bench/netns_link.sh
#   netns_link_up PREFIX SUBNET_OCTET RATE   # sets NA NB (namespaces) and A B (their addresses, 10.OCTET.x.1/.2)
#   trap 'netns_link_down' EXIT INT TERM      # or call it from your own cleanup

netns_link_up() {
  local prefix=$1 octet=$2 rate=$3 tag=$$
  NA="${prefix}_a_$tag" NB="${prefix}_b_$tag"
  local va="${prefix}a$tag" vb="${prefix}b$tag" sub="10.$octet.$((tag % 250))"
  A="$sub.1" B="$sub.2" NETNS_VETH=$va
  ip netns add "$NA"
  ip netns add "$NB"
  ip link add "$va" type veth peer name "$vb"
  ip link set "$va" netns "$NA"
  ip link set "$vb" netns "$NB"
  ip -n "$NA" addr add "$A/30" dev "$va"
  ip -n "$NB" addr add "$B/30" dev "$vb"
  for ns in "$NA" "$NB"; do ip -n "$ns" link set lo up; done
  ip -n "$NA" link set "$va" up
  ip -n "$NB" link set "$vb" up
  # Both directions: a push_pull and a ring all-reduce both send each way.
  ip netns exec "$NA" tc qdisc add dev "$va" root tbf rate "$rate" burst 256kb latency 20ms
  ip netns exec "$NB" tc qdisc add dev "$vb" root tbf rate "$rate" burst 256kb latency 20ms
}

# Deleting a namespace deletes its end of the veth pair, and with it the other end; a pair that never left this
# namespace (set-up failed half-way) is deleted here.
netns_link_down() {
  [[ -n ${NA:-} ]] && ip netns del "$NA" 2>/dev/null || true
  [[ -n ${NB:-} ]] && ip netns del "$NB" 2>/dev/null || true
  [[ -n ${NETNS_VETH:-} ]] && ip link del "$NETNS_VETH" 2>/dev/null || true
}
