#!/usr/bin/env bash
# Every GPU check of commsched in one go, for a machine with a CUDA GPU: configure with the NCCL backend required,
# build the GPU test targets, run them with skips treated as failures (a skip here means the GPU was not usable).
#
#   scripts/gpu_checks.sh [build-dir]        (default: build-gpu; COMMSCHED_GPU_CHECK_JOBS sets build parallelism)
#
# Everything it prints also goes to the results file, $COMMSCHED_GPU_RESULTS (default: <build-dir>/gpu_checks.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build-gpu}"
JOBS="${COMMSCHED_GPU_CHECK_JOBS:-$(nproc)}"
mkdir -p "$BUILD"
RESULTS="${COMMSCHED_GPU_RESULTS:-$BUILD/gpu_checks.txt}"
exec > >(tee "$RESULTS") 2>&1
echo "gpu_checks: $(date -u '+%Y-%m-%d %H:%M UTC') commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv || echo "nvidia-smi not found"

cmake -G Ninja -S . -B "$BUILD" -DCOMMSCHED_WITH_CUDA=ON -DCOMMSCHED_BUILD_PYTHON=OFF -DCOMMSCHED_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" --target nccl_backend_test -j"$JOBS"

# A GPU run must not skip (a skip means no usable GPU), so count the skipped tests.
out="$("$BUILD"/tests/unit/collective/nccl_backend_test --gtest_brief=0 2>&1)" || { echo "$out"; exit 1; }
echo "$out"
gpus="$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)"
skipped="$(grep '^\[  SKIPPED \] NcclBackend\.' <<<"$out" | grep -o 'NcclBackend\.[A-Za-z]*' | sort -u | wc -l)"
# The two-GPU test may skip on a one-GPU machine; nothing else may.
allowed=0
[ "$gpus" -lt 2 ] && allowed=1
if [ "$skipped" -gt "$allowed" ]; then
  echo "gpu_checks: $skipped NCCL test(s) skipped on a machine with $gpus GPU(s)" >&2
  exit 1
fi

# The conformance suite's NCCL cases (one GPU per rank): the cases with no more ranks than GPUs must run, not skip.
cmake --build "$BUILD" --target conformance_test conformance_rank -j"$JOBS"
conf="$("$BUILD"/tests/integration/conformance/conformance_test --gtest_filter='Nccl/*' 2>&1)" || { echo "$conf"; exit 1; }
echo "$conf" | grep -E '^\[ +(OK|SKIPPED|FAILED) +\]' || true
for n in 1 2 3 4; do
  [ "$n" -gt "$gpus" ] && break
  if grep -q "^\[  SKIPPED \] Nccl/.*/nccl_${n}ranks_" <<<"$conf"; then
    echo "gpu_checks: NCCL conformance cases with $n rank(s) skipped on a machine with $gpus GPU(s)" >&2
    exit 1
  fi
done
# The device-copy stage on CUDA (the parameter server's path for CUDA tensors) and the host-to-device stage in front
# of NCCL (control messages on host tensors under COMMSCHED_BACKEND=nccl): no test may skip, and the host stand-in
# suite runs beside it. Then the staging bandwidth against plain cudaMemcpy of the same bytes.
cmake --build "$BUILD" --target cuda_copy_test device_copy_test staging_bandwidth -j"$JOBS"
"$BUILD"/tests/unit/device/device_copy_test --gtest_brief=1
copy="$("$BUILD"/tests/unit/device/cuda_copy_test 2>&1)" || { echo "$copy"; exit 1; }
echo "$copy"
if grep -q '^\[  SKIPPED \]' <<<"$copy"; then
  echo "gpu_checks: CUDA copy tests skipped on a machine with $gpus GPU(s)" >&2
  exit 1
fi
# Hierarchical mode with the NCCL local collective (2 emulated machines x 2 GPUs, one server in the process): needs two
# GPUs, so it may skip on a one-GPU machine and nowhere else; the CPU (Gloo) cases run beside it.
cmake --build "$BUILD" --target hierarchical_test -j"$JOBS"
hier="$("$BUILD"/tests/unit/hierarchical/hierarchical_test 2>&1)" || { echo "$hier"; exit 1; }
echo "$hier" | grep -E '^\[ +(OK|SKIPPED|FAILED|PASSED) +\]' || true
if [ "$gpus" -ge 2 ] && grep -q '^\[  SKIPPED \] HierarchicalNccl\.' <<<"$hier"; then
  echo "gpu_checks: hierarchical NCCL test skipped on a machine with $gpus GPU(s)" >&2
  exit 1
fi
echo "gpu_checks: staging bandwidth (device -> pinned host -> device through the engine, vs plain cudaMemcpy)"
"$BUILD"/bench/gpu/staging_bandwidth 512 4096 5
"$BUILD"/bench/gpu/staging_bandwidth 512 1024 5
echo "gpu_checks: all GPU checks passed ($gpus GPU(s)); results in $RESULTS"
