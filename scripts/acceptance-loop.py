#!/usr/bin/env python3
"""Mean acceptance (tokens per round) of `domino generate --json` over a prompts file.

One `generate` per prompt, the prompt passed byte for byte (a shell loop with "$(...)" strips the
trailing newline every HumanEval prompt ends with, and the model then writes other text), reading
`stats.acceptance_lengths`. Prints a running line per prompt and the total; --out keeps every
prompt's rounds and output ids as JSON.

    python3 scripts/acceptance-loop.py --prompts ~/.cache/domino/humaneval/prompts.jsonl --first 40 \
        -- --max-tokens 64 --draft drafters/smollm2-135m-instruct-domino --draft-len 7 --draft-vocab full
"""
import argparse
import json
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domino", default="target/release/domino", help="the domino binary")
    ap.add_argument("--prompts", required=True, help='a .jsonl file of {"prompt": ...} (optionally "chat": true)')
    ap.add_argument("--first", type=int, default=0, help="only the first N prompts (0: all)")
    ap.add_argument("--out", help="write every prompt's rounds and output ids here")
    ap.add_argument("generate_args", nargs="*", help="arguments for `domino generate` (after --)")
    a = ap.parse_args()
    with open(a.prompts, encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    if a.first > 0:
        prompts = prompts[: a.first]
    rows, accepted, rounds = [], 0, 0
    for i, p in enumerate(prompts):
        if "prompt" not in p:
            print(f"line {i + 1}: no \"prompt\"", file=sys.stderr)
            return 2
        cmd = [a.domino, "generate", "--prompt", p["prompt"], "--json", *a.generate_args]
        if p.get("chat"):
            cmd.append("--chat")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"prompt {i}: domino generate failed: {r.stderr.strip()[-800:]}", file=sys.stderr)
            return 1
        v = json.loads(r.stdout)
        lengths = v["stats"]["acceptance_lengths"]
        accepted += sum(lengths)
        rounds += len(lengths)
        rows.append({"i": i, "acceptance_lengths": lengths, "draft_lengths": v["stats"].get("draft_lengths"), "output_ids": v["output_ids"]})
        print(f"{i} {len(lengths)} rounds, running mean {accepted / max(rounds, 1):.3f}", flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(rows, f)
    tokens = sum(len(r["output_ids"]) for r in rows)
    print(f"{len(rows)} prompts, {rounds} rounds, {tokens} tokens: mean acceptance {accepted / max(rounds, 1):.3f} tokens per round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
