#!/usr/bin/env bash
# Reproduces the shipped SmolLM2 drafter (drafters/smollm2-135m-instruct-domino/) in one command, on
# the CPU and the software Vulkan adapter of a 2-core machine (about 1.5 hours here: data ~45 min,
# 400 training steps ~35-45 min):
#
#   bash scripts/train-smollm2-drafter.sh [OUT_DIR]     # default OUT_DIR: drafters/smollm2-135m-instruct-domino
#
# 1. prompts: 160 function signatures + docstrings of the Python standard library
#    (scripts/drafter-prompts.py; NOT HumanEval, which evaluates the drafter),
# 2. `domino train data`: SmolLM2-135M-Instruct's own greedy continuations (96 tokens each) and its
#    features at target layers 1, 8, 14, 20, 27, through the engine (Q4_1 weights, as at inference),
# 3. `domino train drafter`: burn on the CPU, base-anchored curriculum (spec §6), one draft layer
#    initialised from the target's last layer, block 8, Domino head (emb 64, GRU 128).
# Both steps resume where they stopped when the command is run again (work files in $WORK).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-drafters/smollm2-135m-instruct-domino}"
cache="${DOMINO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/domino}"
work="${WORK:-$cache/smollm2-drafter-work}"
# The shipped drafter is step 400 of a 700-step schedule (the session that trained it ran out of
# time there): --stop-after 400 reproduces it; STOP_AFTER=700 runs the whole schedule.
steps="${STEPS:-700}"
stop_after="${STOP_AFTER:-400}"
mkdir -p "$work"

bash scripts/setup.sh
cargo build --release -p domino-cli
domino="$root/target/release/domino"

python3 scripts/drafter-prompts.py --count 160 --out "$work/prompts.jsonl"
"$domino" train data --prompts "$work/prompts.jsonl" --out "$work/data" --max-new-tokens 96 --dtype auto --shard-size 16
"$domino" train drafter --data "$work/data" --out "$work/drafter" --layers 1 --block-size 8 \
    --emb-dim 64 --gru-hidden 128 --steps "$steps" --batch 4 --anchors 32 --lr 6e-4 --decay-ratio 0.5 \
    --save-every 100 --seed 0 --stop-after "$stop_after"
mkdir -p "$out"
cp "$work/drafter/config.json" "$out/"
# f16 on disk: half the size, the same GPU weights (the engine stores drafters as f16 by default).
python3 scripts/safetensors-f16.py "$work/drafter/model.safetensors" "$out/model.safetensors"
echo "drafter written to $out"
