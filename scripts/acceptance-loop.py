#!/usr/bin/env python3
"""Mean acceptance (tokens per round) of `domino generate --json` over a prompts file.

One `generate` per prompt, the prompt passed byte for byte (a shell loop with "$(...)" strips the
trailing newline every HumanEval prompt ends with, and the model then writes other text), reading
`stats.acceptance_lengths`. Prints a running line per prompt and the total; --out keeps every
prompt's rounds and output ids as JSON. Greedy output must not depend on the drafter: --compare
checks every prompt's output ids against an earlier --out file (a run without --draft, say) and exits
1 naming the prompts that differ.

    python3 scripts/acceptance-loop.py --prompts ~/.cache/domino/humaneval/prompts.jsonl --first 40 \
        -- --max-tokens 64 --draft drafters/smollm2-135m-instruct-domino --draft-len 7 --draft-vocab full

    python3 scripts/acceptance-loop.py --prompts ... --first 40 --out plain.json -- --max-tokens 64
    python3 scripts/acceptance-loop.py --prompts ... --first 40 --compare plain.json -- --max-tokens 64 --draft ...
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
    ap.add_argument("--compare", help="an earlier --out file whose output ids every prompt must reproduce")
    ap.add_argument("generate_args", nargs="*", help="arguments for `domino generate` (after --)")
    a = ap.parse_args()
    with open(a.prompts, encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    if a.first > 0:
        prompts = prompts[: a.first]
    reference = None
    if a.compare:
        with open(a.compare, encoding="utf-8") as f:
            reference = {r["i"]: r["output_ids"] for r in json.load(f)}
        missing = [i for i in range(len(prompts)) if i not in reference]
        if missing:
            print(f"{a.compare} has no output for prompts {missing[:10]}", file=sys.stderr)
            return 2
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
        lengths = v["stats"].get("acceptance_lengths") or []
        accepted += sum(lengths)
        rounds += len(lengths)
        rows.append({"i": i, "acceptance_lengths": lengths, "draft_lengths": v["stats"].get("draft_lengths"), "output_ids": v["output_ids"]})
        print(f"{i} {len(lengths)} rounds, running mean {accepted / max(rounds, 1):.3f}", flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(rows, f)
    tokens = sum(len(r["output_ids"]) for r in rows)
    print(f"{len(rows)} prompts, {rounds} rounds, {tokens} tokens: mean acceptance {accepted / max(rounds, 1):.3f} tokens per round")
    if reference is not None:
        differ = [r["i"] for r in rows if r["output_ids"] != reference[r["i"]]]
        if differ:
            for i in differ:
                mine, theirs = rows[i]["output_ids"], reference[i]
                at = next((j for j, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
                print(f"prompt {i}: output differs from {a.compare} at token {at} ({len(mine)} tokens against {len(theirs)})")
            print(f"{len(differ)} of {len(rows)} prompts differ from {a.compare}")
            return 1
        print(f"every prompt's output equals {a.compare}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
