# Sourced by the namespace benchmarks (bash): two network namespaces joined by a veth pair, each end shaped with
# `tc ... tbf` (no netem). Every address lives only inside the namespaces; netns_link_down deletes them.
#
#   source bench/netns_link.sh
#   netns_link_up PREFIX SUBNET_OCTET RATE   # sets NA NB (namespaces) and A B (their addresses, 10.OCTET.x.1/.2)
#   trap 'netns_link_down' EXIT INT TERM      # or call it from your own cleanup
#   PIDS+=($!); ...; netns_stop_pids [KILL]   # in a cleanup: signal every process the script started, reap them

# Signals (TERM unless told) every process in the caller's PIDS array and waits for the script's children, so no
# process outlives the namespaces the cleanup deletes next.
netns_stop_pids() {
  local sig=${1:-TERM} p
  for p in "${PIDS[@]}"; do kill -"$sig" "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}

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

# A star: N hosts (namespaces PREFIX_i_TAG, addresses 10.OCTET.x.(i+1)/24, interface eth0), each joined by a veth pair
# to a Linux bridge in a "switch" namespace, like hosts on one switch. Each host's link is shaped with tbf at RATE on
# BOTH ends of its pair: the host end limits what the host sends, the switch end what it receives.
#
#   netns_star_up PREFIX OCTET N RATE   # sets STAR_HOSTS and STAR_ADDRS (arrays) and STAR_SWITCH
#   trap 'netns_star_down' EXIT INT TERM
netns_star_up() {
  local prefix=$1 octet=$2 n=$3 rate=$4 tag=$$
  local sub="10.$octet.$((tag % 250))"
  STAR_SWITCH="${prefix}_sw_$tag" STAR_HOSTS=() STAR_ADDRS=() STAR_VETHS=()
  ip netns add "$STAR_SWITCH"
  ip -n "$STAR_SWITCH" link set lo up
  ip -n "$STAR_SWITCH" link add br0 type bridge
  ip -n "$STAR_SWITCH" link set br0 up
  for ((i = 0; i < n; ++i)); do
    local ns="${prefix}_${i}_$tag" h="${prefix:0:3}${tag}h$i" p="${prefix:0:3}${tag}p$i" addr="$sub.$((i + 1))"
    STAR_HOSTS+=("$ns")
    STAR_ADDRS+=("$addr")
    STAR_VETHS+=("$h")
    ip netns add "$ns"
    ip link add "$h" type veth peer name "$p"
    ip link set "$h" netns "$ns"
    ip link set "$p" netns "$STAR_SWITCH"
    ip -n "$ns" link set "$h" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$STAR_SWITCH" link set "$p" master br0
    ip -n "$STAR_SWITCH" link set "$p" up
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 20ms
    ip netns exec "$STAR_SWITCH" tc qdisc add dev "$p" root tbf rate "$rate" burst 256kb latency 20ms
  done
}

netns_star_down() {
  local ns v
  for ns in "${STAR_HOSTS[@]}" "${STAR_SWITCH:-}"; do [[ -n $ns ]] && ip netns del "$ns" 2>/dev/null || true; done
  for v in "${STAR_VETHS[@]}"; do ip link del "$v" 2>/dev/null || true; done
  return 0
}
