#!/usr/bin/env bash
# README command (1): set everything up, then run the main job: a local parameter-server cluster (4 worker and 2
# server processes on loopback, EMULATED 2 Gbit/s links) trains ResNet-50's gradient profile (compute emulated by
# sleeping, 8x the profiled GPU time so compute and communication are of the same order on this CPU) with the WFBP
# baseline, with the scheduler at its default knobs, and with the scheduler auto-tuned live; it prints the iteration
# times, the knobs the tuner kept and the speedups over WFBP. Sums are checked. Arguments replace the defaults and
# go to `commsched run` (e.g. --model vgg16 --backend loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
if [ $# -eq 0 ]; then
  set -- --backend ps -w 4 -s 2 --bandwidth 2gbit --model resnet50 --compute-scale 8 --iterations 8 --tune
fi
exec ./build/plugins/commsched run "$@"
