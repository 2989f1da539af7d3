#!/usr/bin/env bash
# README command (1): set everything up, then run the main job: a model profile through the engine with the WFBP
# baseline and with the scheduler, printing both iteration times and the speedup. Extra arguments go to `commsched run`
# (e.g. --model resnet50, --backend ps -w 4 -s 2 --bandwidth 5gbit).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
exec ./build/plugins/commsched run "$@"
