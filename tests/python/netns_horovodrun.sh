#!/usr/bin/env bash
# `commsched horovodrun -np NP -H A:SLOTS_A,B:SLOTS_B` across two hosts: network namespaces joined by a veth pair
# (bench/netns_link.sh), each reached through a stand-in for ssh (this machine runs no sshd) that runs the command
# in that host's namespace with a bare environment, as a remote login shell would. As ssh without a tty, it relays
# stdin until it ends or the stand-in dies, and forwards no signal: the remote command runs in a session of its own.
# Needs root.
#   netns_horovodrun.sh COMMSCHED_BIN NP SLOTS_A SLOTS_B -- worker command...
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/bench/netns_link.sh"
fake=$(mktemp)
trap 'netns_link_down; rm -f "$fake"' EXIT INT TERM
bin=$1 np=$2 slots_a=$3 slots_b=$4
shift 5
netns_link_up chr 78 1gbit
# ssh [-o OPT] [-p PORT] [-i FILE] HOST COMMAND
cat >"$fake" <<EOF
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift 2; done
case \$1 in $A) ns=$NA ;; $B) ns=$NB ;; *) echo "ssh stand-in: unknown host \$1" >&2; exit 255 ;; esac
channel=\$(mktemp -u) && mkfifo "\$channel" || exit 255
exec 3<&0  # a background job's stdin would be /dev/null
cat <&3 >"\$channel" & relay=\$!
trap 'kill \$relay 2>/dev/null; rm -f "\$channel"' EXIT
trap 'exit 255' INT TERM
setsid ip netns exec "\$ns" env -i PATH="$PATH" /bin/sh -c "\$2" <"\$channel" 3<&- & remote=\$!
wait \$remote
EOF
chmod +x "$fake"
ip netns exec "$NA" "$bin" horovodrun -np "$np" -H "$A:$slots_a,$B:$slots_b" --ssh-command "$fake" --verbose "$@"
