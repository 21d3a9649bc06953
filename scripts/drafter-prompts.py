#!/usr/bin/env python3
"""Training prompts for the SmolLM2 drafter, from the Python standard library (NOT HumanEval).

Each prompt is a top-level function's signature and docstring, the way a code-completion request
starts ("def name(args):\n    \"\"\"doc\"\"\"\n"); the target model writes the body. Deterministic:
modules in sorted order, functions in file order, the first N that qualify.

    python3 scripts/drafter-prompts.py --count 400 --out prompts.jsonl
"""
import argparse
import ast
import json
import os
import sysconfig


def functions(path):
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc or len(doc) < 40 or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
            continue
        start = node.lineno - 1 - len(node.decorator_list)
        text = "".join(lines[start:first.end_lineno])
        if len(text) > 1200 or not node.body[1:]:
            continue
        yield text if text.endswith("\n") else text + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    stdlib = sysconfig.get_paths()["stdlib"]
    prompts = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                prompts.extend(functions(os.path.join(root, name)))
    if len(prompts) < args.count:
        raise SystemExit(f"only {len(prompts)} functions with docstrings found in {stdlib}")
    # Spread the picks over the whole library rather than the first modules alphabetically.
    step = len(prompts) / args.count
    picked = [prompts[int(i * step)] for i in range(args.count)]
    with open(args.out, "w", encoding="utf-8") as f:
        for p in picked:
            f.write(json.dumps({"prompt": p}) + "\n")
    print(f"wrote {args.out}: {len(picked)} prompts from {len(prompts)} stdlib functions in {stdlib}")


if __name__ == "__main__":
    main()
