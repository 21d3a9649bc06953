#!/usr/bin/env bash
# The project's test command: `bash scripts/test.sh [extra cargo test arguments]`.
#
# 1. installs what is missing (scripts/setup.sh --test: software Vulkan + GL drivers, npm),
# 2. fetches the real Qwen3 tokenizer (scripts/fetch-test-data.sh),
# 3. builds the whole workspace's tests, prints the GPU adapters (`domino devices`),
# 4. runs `cargo test --workspace`, one test at a time per binary (RUST_TEST_THREADS=1 unless set),
# 5. builds the browser build (web/build.sh), puts the page's default model and drafter in web/models/
#    (web/fetch-models.sh) and runs the browser test (web/tests/browser.test.mjs).
#
# The GPU tests run on BOTH software adapters, Vulkan (lavapipe: shader-f16 and subgroup variants, plus
# the same device forced onto the fallback variants) and GL (llvmpipe via EGL: fallback variants). A
# missing adapter fails the tests; DOMINO_TEST_BACKENDS=vulkan (or gl) narrows the set on purpose.
#
# Debug build: [profile.test] is opt-level 1 and dependencies are opt-level 2 (Cargo.toml), which
# builds faster from clean than --release on a 2-core machine and still runs the kernels quickly.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh --test

if [[ -z "${XDG_RUNTIME_DIR:-}" ]]; then
    # EGL (the GL backend) warns on every process start without it.
    XDG_RUNTIME_DIR="$(mktemp -d)"
    chmod 700 "$XDG_RUNTIME_DIR"
    export XDG_RUNTIME_DIR
fi

bash scripts/fetch-test-data.sh

echo "== build (cargo test --workspace --no-run)"
cargo test --workspace --no-run "$@"

# The CLI binary the integration tests use was just built with the tests' profile and features, so
# listing adapters with it costs no extra compilation (a `cargo run -p domino-cli` would: package
# selection changes dependency features, which rebuilds wgpu).
target_dir="$(cargo metadata --no-deps --format-version 1 | grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)"
echo "== GPU adapters (domino devices)"
"$target_dir/debug/domino" devices || echo "warning: 'domino devices' found no adapter; the GPU tests will fail" >&2
echo "== test backends: ${DOMINO_TEST_BACKENDS:-vulkan,gl (default)}"

# One test at a time within each test binary (RUST_TEST_THREADS, unless set): the software adapters
# (lavapipe, llvmpipe) already spread every dispatch over all cores, and two tests driving them at
# once on a 2-core machine thrash: the kernel tests took 152 s with two test threads and 44 s with
# one, the quantized-kernel tests 277 s and 31 s.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-1}"
echo "== test (cargo test --workspace, RUST_TEST_THREADS=$RUST_TEST_THREADS)"
cargo test --workspace "$@"

# The browser build and its test: the demo page in headless Chromium (WebGPU on SwiftShader) must
# give the same tokens as the native binary built above. Artifacts (screenshot, reports) go to
# target/web-test/.
echo "== browser build (bash web/build.sh)"
bash web/build.sh
# The page's default model and drafter (the real SmolLM2 GGUF and the shipped drafter) into
# web/models/, where the page and the browser test fetch them.
bash web/fetch-models.sh
echo "== browser test (node web/tests/browser.test.mjs)"
DOMINO_BIN="$target_dir/debug/domino" node web/tests/browser.test.mjs
