#!/usr/bin/env bash
# Builds the browser build: crates/web -> wasm32 -> web/pkg (domino_web.js + domino_web_bg.wasm).
#
#   bash web/build.sh            # release build
#
# Toolchain: rustup's wasm32-unknown-unknown target when it is installed; otherwise Debian's rustc-web
# (apt-get install rustc-web cargo-web rust-web-src rust-web-llvm lld-22) with -Zbuild-std (docs/browser.md). Installs the wasm-bindgen CLI pinned to the wasm-bindgen version in
# Cargo.lock when it is missing (cargo install, without --locked). Builds into target/wasm so it never
# waits on the native builds' lock of target/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

target=wasm32-unknown-unknown
export CARGO_TARGET_DIR="${DOMINO_WASM_TARGET_DIR:-$root/target/wasm}"
# tokenizers' fancy-regex path pulls getrandom 0.3, which needs its JS backend selected explicitly.
export RUSTFLAGS="${RUSTFLAGS:-} --cfg getrandom_backend=\"wasm_js\""

if command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    echo "build.sh: rustup toolchain with the $target target"
    cargo build --release --target "$target" -p domino-web
elif [[ -x /usr/bin/rustc && -d /usr/lib/rustlib/src/rust/library ]]; then
    echo "build.sh: Debian rustc-web ($(/usr/bin/rustc --version)) with -Zbuild-std"
    RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 /usr/bin/cargo build \
        -Zbuild-std=std,panic_abort --target "$target" --release -p domino-web
else
    echo "build.sh: no wasm32 toolchain: run 'rustup target add $target', or on Debian 12" \
         "'apt-get install rustc-web cargo-web rust-web-src rust-web-llvm lld-22'" >&2
    exit 1
fi

# The CLI must match the wasm-bindgen crate exactly.
want="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)"
if [[ -z "$want" ]]; then
    echo "build.sh: wasm-bindgen not found in Cargo.lock" >&2
    exit 1
fi
have="$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)"
if [[ "$have" != "$want" ]]; then
    echo "build.sh: installing wasm-bindgen-cli $want (found '${have:-none}'; a few minutes, once)"
    # Not --locked: one of its locked dependency versions is no longer on the registry.
    env -u RUSTFLAGS -u CARGO_TARGET_DIR cargo install wasm-bindgen-cli --version "$want"
fi

rm -rf web/pkg
wasm-bindgen --target web --out-dir web/pkg "$CARGO_TARGET_DIR/$target/release/domino_web.wasm"
raw=$(stat -c %s web/pkg/domino_web_bg.wasm)
gz=$(gzip -9 -c web/pkg/domino_web_bg.wasm | wc -c)
echo "build.sh: web/pkg/domino_web_bg.wasm $raw bytes ($gz gzipped)"
if [[ ! -f web/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
    echo "build.sh: the page's default model and drafter are not in web/models/ yet: bash web/fetch-models.sh"
fi
