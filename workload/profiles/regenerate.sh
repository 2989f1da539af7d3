#!/bin/sh
# Regenerates every profile in this folder. The time scales are documented in README.md ("Where the times come from").
set -e
cd "$(dirname "$0")"
PY=${PYTHON:-/usr/bin/python3}
CNN_SRC="sizes: torchvision 0.14 definition (weights=None); times: published V100 FP32 training throughput at batch 32-64"
NLP_SRC="sizes: published config built with torch.nn (make_profile.py); times: forward FLOPs x 3 at an assumed 8 TFLOP/s (about 50% of V100 FP32 peak)"
SPLIT="split across modules in proportion to forward FLOPs (1 sample), backward = 2 x forward"

$PY make_profile.py vgg16 --batch 32 --total-ms 139.1 --device "V100 (published throughput)" -o vgg16.json \
  --source "$CNN_SRC (about 230 img/s -> 139.1 ms per batch of 32); $SPLIT"
$PY make_profile.py resnet50 --batch 32 --total-ms 88.9 --device "V100 (published throughput)" -o resnet50.json \
  --source "$CNN_SRC (about 360 img/s -> 88.9 ms per batch of 32); $SPLIT"
$PY make_profile.py bert-base --batch 32 --seq 128 --tflops 8 --device "V100 (FLOP estimate)" -o bert-base.json \
  --source "$NLP_SRC; BERT-base L=12 H=768 A=12, vocab 30522, seq 128, batch 32; $SPLIT"
$PY make_profile.py bert-large --batch 32 --seq 128 --tflops 8 --device "V100 (FLOP estimate)" -o bert-large.json \
  --source "$NLP_SRC; BERT-large L=24 H=1024 A=16, vocab 30522, seq 128, batch 32; $SPLIT"
$PY make_profile.py transformer-base --batch 32 --seq 128 --tflops 8 --device "V100 (FLOP estimate)" \
  -o transformer-base.json \
  --source "$NLP_SRC; Transformer-base d=512 ff=2048 h=8 6+6 layers, shared 37000-token embedding, seq 128, batch 32; $SPLIT"
