#!/usr/bin/env bash
# Installs system dependencies (idempotent), configures and builds commsched into ${BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
./.ci/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DPython_EXECUTABLE=/usr/bin/python3 "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
