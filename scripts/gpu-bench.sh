#!/usr/bin/env bash
# The GPU measurement: on a machine with a real GPU, compare the two kernel families side by side.
#
#   bash scripts/gpu-bench.sh [OUT_DIR]      # default OUT_DIR: target/gpu-bench
#
# 1. lists the adapters (vulkaninfo --summary and `domino devices`); where Vulkan finds no GPU it
#    says which loader library or ICD driver file is missing;
# 2. writes two random models: one with Qwen3-8B's layer shapes (hidden 4096, 2 layers, 32 heads,
#    8 kv heads, head_dim 128, intermediate 12288, vocab 16384) and one shaped like SmolLM2-135M;
# 3. prints `domino plan --kernels gpu` of the 4096-hidden model (the parallelism each kernel offers);
# 4. runs `domino bench` with --kernels gpu and --kernels cpu on each model (plain decode, 17-row
#    verify cost through an always-accepting drafter) and prints decode tok/s and the roofline ratio;
# 5. writes the JSON reports and one merged HTML/Markdown report into OUT_DIR.
#
# DOMINO_BIN picks the binary (default: target/release/domino, built here if missing).
# BENCH_BACKEND (default vulkan) and BENCH_ADAPTER (default 0) pick the adapter.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-target/gpu-bench}"
mkdir -p "$out"
backend="${BENCH_BACKEND:-vulkan}"
adapter="${BENCH_ADAPTER:-0}"
bin="${DOMINO_BIN:-target/release/domino}"
if [[ ! -x "$bin" ]]; then
    echo "== building $bin (cargo build --release -p domino-cli)"
    cargo build --release -p domino-cli
fi

echo "== adapters"
if command -v vulkaninfo >/dev/null 2>&1; then
    vulkaninfo --summary 2>&1 | sed -n '/Devices:/,$p' || true
else
    echo "vulkaninfo not installed (apt-get install vulkan-tools)"
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1'; then
    echo "warning: libvulkan.so.1 (the Vulkan loader) is missing: apt-get install libvulkan1" >&2
fi
icds=$(ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json 2>/dev/null || true)
if [[ -z "$icds" ]]; then
    echo "warning: no Vulkan ICD file in /usr/share/vulkan/icd.d or /etc/vulkan/icd.d:" \
         "the GPU driver's Vulkan part is not installed (NVIDIA: nvidia_icd.json from the driver;" \
         "AMD/Intel: mesa-vulkan-drivers)" >&2
else
    echo "Vulkan ICD files: $(echo $icds | tr '\n' ' ')"
fi
"$bin" devices --backend "$backend" || { echo "error: no $backend adapter: see the warnings above" >&2; exit 1; }

big="$out/qwen3-8b-shapes"
small="$out/smollm2-shapes"
if [[ ! -f "$big/config.json" ]]; then
    echo "== writing the 4096-hidden model (Qwen3-8B layer shapes, 2 layers)"
    "$bin" random-model --out "$big" --hidden 4096 --layers 2 --heads 32 --kv-heads 8 --head-dim 128 \
        --intermediate 12288 --vocab 16384 --always-accept-drafter "$big-drafter" --block-size 17
fi
if [[ ! -f "$small/config.json" ]]; then
    echo "== writing the SmolLM2-shaped model (hidden 576, 30 layers)"
    "$bin" random-model --out "$small" --hidden 576 --layers 30 --heads 9 --kv-heads 3 --head-dim 64 \
        --intermediate 1536 --vocab 49152 --tied --always-accept-drafter "$small-drafter" --block-size 17
fi

echo "== plan: decode step of the 4096-hidden model at context 4096, GPU kernels"
"$bin" plan --model "$big" --kernels gpu --context 4096 --backend "$backend" --adapter "$adapter" | tail -n 25

reports=()
for model in "$big" "$small"; do
    for kernels in gpu cpu; do
        name="$(basename "$model")-$kernels"
        echo "== bench $name"
        "$bin" bench --model "$model" --draft "$model-drafter" --prompt-len 32 --max-tokens 64 --runs 3 \
            --backend "$backend" --adapter "$adapter" --kernels "$kernels" --dtype f16 \
            --json "$out/$name.json" | tee "$out/$name.txt"
        reports+=("$out/$name.json")
    done
done

echo "== summary (decode tok/s and roofline ratio per kernel family)"
"$bin" report "${reports[@]}" --markdown "$out/report.md" --html "$out/report.html"
grep -H -E "^plain|^domino" "$out"/*.txt || true
echo "reports: $out/report.md, $out/report.html, $out/*.json"
