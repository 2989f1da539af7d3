#!/usr/bin/env bash
# Parameter-server tests and goodput over UCX's RDMA verbs transports (UCX_TLS=rc, then ud), when this host has an
# RDMA device. Without one it says so and exits 0 having run nothing (not a pass: a skip).
#   scripts/rdma_checks.sh [BUILD_DIR]      (default: build; run ./scripts/build.sh first)
# Extra UCX settings pass through (UCX_NET_DEVICES=mlx5_0:1, UCX_IB_GID_INDEX=3 for RoCE v2, ...): see README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
devices=""
if command -v ibv_devices >/dev/null; then
  devices=$(ibv_devices 2>/dev/null | awk 'NR > 2 && NF { print $1 }')
fi
if [ -z "$devices" ]; then
  echo "rdma_checks: SKIPPED: ibv_devices lists no RDMA device on $(hostname); no RDMA test or benchmark was run"
  exit 0
fi
echo "rdma_checks: RDMA devices: $devices"
command -v ucx_info >/dev/null && ucx_info -d | grep -E "Transport: (rc|ud|dc)" | sort | uniq -c || true
if [ "$(ulimit -l)" != "unlimited" ]; then
  echo "rdma_checks: warning: locked-memory limit is $(ulimit -l) KiB; RDMA registration may fail (ulimit -l unlimited)"
fi
[ -x "$BUILD/tests/integration/ps/ps_integration_tests" ] || { echo "rdma_checks: build first (./scripts/build.sh)"; exit 2; }
status=0
# rc needs a connectionless transport to set its connections up: ud only for that (":aux").
for tls in "rc,ud:aux,self" "ud,self"; do
  echo "=== UCX_TLS=$tls: PS integration tests"
  if ! COMMSCHED_TEST_UCX_TLS="$tls" "$BUILD/tests/integration/ps/ps_integration_tests" --gtest_filter='*ucx_env*'; then
    status=1
  fi
  echo "=== UCX_TLS=$tls: goodput (beside zmq, UCX shared memory and UCX TCP)"
  "$BUILD/bench/ps/ps_goodput" transports --mib-per-size 256 --reps 3 --ucx-tls "$tls" || status=1
done
exit $status
