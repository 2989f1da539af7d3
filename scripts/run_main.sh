#!/usr/bin/env bash
# README command (1): set everything up, then run the main job: a local parameter-server cluster (commsched launch:
# 2 worker and 1 server processes on loopback, EMULATED 1 Gbit/s link per process) trains a small CNN with
# commsched.torch three times: the WFBP baseline, the scheduler at its default knobs, and the scheduler auto-tuned live.
# It prints the step times, images/s, the loss falling, the knobs the tuner kept and the speedups (scripts/torch_main.sh;
# WORKERS, SERVERS, RATE, STEPS apply).
# With arguments, they go to `commsched run` instead: a model profile through the engine, e.g.
#   scripts/run_main.sh --backend ps -w 4 -s 2 --bandwidth 2gbit --model resnet50 --compute-scale 8 --tune
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
if [ $# -eq 0 ]; then
  SKIP_BUILD=1 exec ./scripts/torch_main.sh
fi
exec ./build/plugins/commsched run "$@"
