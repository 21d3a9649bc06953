#!/usr/bin/env bash
# Trains the SmolLM2 drafter shipped in drafters/smollm2-135m-instruct-domino on ~657k self-distilled
# tokens, in one command (the recipe of issue 14), on the 2-core build machine (about three hours:
# data ~75 min, training ~58 min; see docs/training.md):
#
#   bash scripts/train-smollm2-drafter.sh [OUT_DIR]     # default OUT_DIR: drafters/smollm2-135m-instruct-domino
#
# 1. prompts, from scripts/drafter-prompts.py; NOT HumanEval, which evaluates the drafter:
#    part 1: 800 function signatures + docstrings of the Python standard library, 1000 of the wheels
#    of sympy 1.14.0 and networkx 3.6.1 and 192 chat requests (greetings, general questions,
#    requests about other stdlib functions);
#    part 2: 1700 functions and 300 chat requests about functions of the wheels of boltons,
#    more-itertools, mpmath, toolz, numpy, pandas and scipy (pinned versions, downloaded from PyPI),
# 2. `domino train data --device cpu`: SmolLM2-135M-Instruct's own greedy continuations (up to 192
#    tokens each) and its features at target layers 1, 8, 14, 20, 27, from the native CPU forward of
#    the same Q4_1 weights (docs/training.md: the same text as the engine),
# 3. `domino train drafter --loss sampled --scale-features`: burn on the CPU, base-anchored
#    curriculum (spec §6), one draft layer initialised from the target's last layer, block 8,
#    Domino head (emb 64, GRU 128), the sampled softmax (1024 frequent + 1024 sampled candidates),
#    features divided by their column RMS while training (folded into fc at export), 2000 steps of
#    8 sequences x 32 anchors, 32 sequences held out.
# Both steps resume where they stopped when the command is run again (work files in $WORK).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-drafters/smollm2-135m-instruct-domino}"
cache="${DOMINO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/domino}"
work="${WORK:-$cache/smollm2-drafter-work5}"
steps="${STEPS:-2000}"
stop_after="${STOP_AFTER:-$steps}"
mkdir -p "$work"

bash scripts/setup.sh
cargo build --release -p domino-cli
domino="$root/target/release/domino"

wheels="$work/wheels"
python3 -m pip download --quiet --no-deps -d "$wheels" sympy==1.14.0 networkx==3.6.1 \
    boltons==26.2.0 more-itertools==11.2.1 mpmath==1.4.1 toolz==1.2.0
# numpy, pandas and scipy ship compiled wheels only; any platform's wheel has the same .py files.
python3 -m pip download --quiet --no-deps -d "$wheels" --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 numpy==2.3.5 pandas==2.3.3 scipy==1.16.3
python3 scripts/drafter-prompts.py --count 800 --chat-count 192 --out "$work/prompts-1.jsonl" \
    --wheel "$wheels/sympy-1.14.0-py3-none-any.whl" --wheel "$wheels/networkx-3.6.1-py3-none-any.whl" --wheel-count 1000
python3 scripts/drafter-prompts.py --count 0 --out "$work/prompts-2.jsonl" --wheel-count 1700 --chat-wheel-count 300 \
    --wheel "$wheels/boltons-26.2.0-py3-none-any.whl" --wheel "$wheels/more_itertools-11.2.1-py3-none-any.whl" \
    --wheel "$wheels/mpmath-1.4.1-py3-none-any.whl" --wheel "$wheels/toolz-1.2.0-py3-none-any.whl" \
    --wheel "$wheels"/numpy-2.3.5-*.whl --wheel "$wheels"/pandas-2.3.3-*.whl --wheel "$wheels"/scipy-1.16.3-*.whl
cat "$work/prompts-1.jsonl" "$work/prompts-2.jsonl" > "$work/prompts.jsonl"
"$domino" train data --prompts "$work/prompts.jsonl" --out "$work/data" --max-new-tokens 192 \
    --shard-size 32 --batch 32 --device cpu
"$domino" train drafter --data "$work/data" --out "$work/drafter-scaled" --layers 1 --block-size 8 \
    --emb-dim 64 --gru-hidden 128 --steps "$steps" --batch 8 --anchors 32 --lr 6e-4 --decay-ratio 0.5 \
    --loss sampled --scale-features --eval-seqs 32 --eval-every 300 --save-every 100 --seed 0 --stop-after "$stop_after"
mkdir -p "$out"
cp "$work/drafter-scaled/config.json" "$out/"
# f16 on disk: half the size, the same GPU weights (the engine stores drafters as f16 by default).
python3 scripts/safetensors-f16.py "$work/drafter-scaled/model.safetensors" "$out/model.safetensors"
echo "drafter written to $out"
