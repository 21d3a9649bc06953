#!/usr/bin/env bash
# Builds the static n-gram table that `--lookup` consults, shipped as
# drafters/smollm2-135m-instruct-domino/lookup-ngrams.safetensors, in one command (about 25 min on
# the 2-core build machine; resumable: run it again and `train data` continues after its last shard):
#
#   bash scripts/build-smollm2-lookup-table.sh [OUT_FILE]
#
# 1. 600 prompts from scripts/drafter-prompts.py, NOT HumanEval (which evaluates lookup): 200
#    function signatures + docstrings of the Python standard library, 340 of the wheels of sympy,
#    networkx, boltons, toolz, mpmath and more-itertools (pinned versions, from PyPI), 60 chat requests;
# 2. `domino train data --device cpu`: SmolLM2-135M-Instruct's own greedy continuations (up to 192
#    tokens each, about 95k tokens), from the native CPU forward of the same Q4_1 weights;
# 3. `domino train ngrams --min-count 1`: for every 2-4 token context of the continuations, the
#    token that most often followed it (about 94k contexts, 2.6 MB).
# See README "Speculative decoding on this machine" and docs/performance.md for what it buys.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-drafters/smollm2-135m-instruct-domino/lookup-ngrams.safetensors}"
cache="${DOMINO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/domino}"
work="${WORK:-$cache/smollm2-lookup-work}"
mkdir -p "$work"

bash scripts/setup.sh
cargo build --release -p domino-cli --bin domino
domino="$root/target/release/domino"
model="$cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

wheels="$work/wheels"
python3 -m pip download --quiet --no-deps -d "$wheels" sympy==1.14.0 networkx==3.6.1 \
    boltons==26.2.0 more-itertools==11.2.1 mpmath==1.4.1 toolz==1.2.0
python3 scripts/drafter-prompts.py --count 200 --chat-count 60 --out "$work/prompts.jsonl" \
    --wheel "$wheels/sympy-1.14.0-py3-none-any.whl" --wheel "$wheels/networkx-3.6.1-py3-none-any.whl" \
    --wheel "$wheels/boltons-26.2.0-py3-none-any.whl" --wheel "$wheels/toolz-1.2.0-py3-none-any.whl" \
    --wheel "$wheels/mpmath-1.4.1-py3-none-any.whl" --wheel "$wheels/more_itertools-11.2.1-py3-none-any.whl" \
    --wheel-count 340 --chat-wheel-count 0
"$domino" train data --model "$model" --prompts "$work/prompts.jsonl" --out "$work/data" \
    --max-new-tokens 192 --batch 32 --device cpu
"$domino" train ngrams --data "$work/data" --out "$out" --min-count 1
