#!/usr/bin/env python3
"""Training prompts for the SmolLM2 drafter, from the Python standard library (NOT HumanEval).

Code prompts (--count): a top-level function's signature and docstring, the way a code-completion
request starts ("def name(args):\n    \"\"\"doc\"\"\"\n"); the target model writes the body.
Chat prompts (--chat-count, written with "chat": true so `train data` wraps them in the chat
template): requests built from other stdlib functions' summaries ("Write a Python function ...",
"Explain what ... does", "How would I use ...") and general questions from a fixed topic list.
More code prompts (--wheel, --wheel-count): functions of other Python packages' wheels, read from the
zip, tests excluded, written after the stdlib ones.
Deterministic: modules in sorted order, functions in file order, picks spread evenly.

    python3 scripts/drafter-prompts.py --count 400 --chat-count 300 --out prompts.jsonl
    python3 scripts/drafter-prompts.py --count 800 --chat-count 192 --wheel sympy-1.14.0-py3-none-any.whl --wheel-count 1000 --out prompts.jsonl
"""
import argparse
import ast
import json
import os
import sysconfig
import zipfile


def functions(path, source=None):
    try:
        if source is None:
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
        yield {
            "code": text if text.endswith("\n") else text + "\n",
            "name": node.name,
            "module": os.path.splitext(os.path.basename(path))[0],
            "args": ast.unparse(node.args),
            "summary": doc.strip().split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip("."),
        }


TOPICS = [
    "the water cycle", "photosynthesis", "how vaccines work", "black holes", "the French Revolution",
    "compound interest", "how a CPU executes instructions", "the causes of seasons", "plate tectonics",
    "how the internet routes packets", "machine learning", "the history of the printing press",
    "healthy sleep habits", "how to start running", "the difference between weather and climate",
    "how rainbows form", "the Roman Empire", "renewable energy", "how bread rises", "public key cryptography",
    "the immune system", "supply and demand", "how airplanes fly", "the solar system", "recycling",
    "version control with git", "time management", "how to learn a new language", "volcanoes", "the Moon landing",
]
TOPIC_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Write a short paragraph about {t}.",
    "What are three interesting facts about {t}?",
    "Can you give me a brief overview of {t}?",
]
GREETINGS = ["Hello", "Hi!", "Hello, who are you?", "Good morning! How are you?", "Hey, can you help me?", "Hi, what can you do?"]
CHAT_TEMPLATES = [
    "Write a Python function `{name}({args})` that does the following: {summary}.",
    "Explain what the Python function `{module}.{name}` does, with a short example.",
    "How would I use `{module}.{name}` in a Python program? Its documentation says: {summary}.",
]


def wheel_functions(wheel):
    """Functions of every module in a wheel (a zip of .py files), in name order, tests excluded."""
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            parts = name.split("/")
            if not name.endswith(".py") or any(p in ("test", "tests", "testing", "benchmarks") for p in parts):
                continue
            yield from functions(name, z.read(name).decode("utf-8", errors="replace"))


def spread(items, count):
    """`count` items spread evenly over the list rather than its first entries."""
    if count == 0:
        return []
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def chat_prompts(functions, count):
    """`count` chat requests: greetings, topic questions, then requests about stdlib functions."""
    fixed = GREETINGS + [t.format(t=topic) for topic in TOPICS for t in TOPIC_TEMPLATES]
    out = fixed[:count]
    need = count - len(out)
    if need > 0:
        step = len(functions) / need
        for i in range(need):
            f = functions[int(i * step + step / 2) % len(functions)]
            out.append(CHAT_TEMPLATES[i % len(CHAT_TEMPLATES)].format(**f))
    return out


def function_chats(functions, count):
    """`count` chat requests about the given functions only (no greetings or topic questions)."""
    return [CHAT_TEMPLATES[i % len(CHAT_TEMPLATES)].format(**f) for i, f in enumerate(spread(functions, count))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=400, help="code-completion prompts")
    ap.add_argument("--chat-count", type=int, default=0, help="chat prompts (written with \"chat\": true)")
    ap.add_argument("--wheel", action="append", default=[],
                    help="a Python wheel whose functions give more code prompts (repeatable)")
    ap.add_argument("--wheel-count", type=int, default=0, help="code prompts from the wheels, spread over them all")
    ap.add_argument("--chat-wheel-count", type=int, default=0,
                    help="chat requests about wheel functions (other than the code prompts' ones where the wheels have enough)")
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
    picked = [p["code"] for p in spread(prompts, args.count)]
    chats = chat_prompts(prompts, args.chat_count)
    extra = [f for wheel in args.wheel for f in wheel_functions(wheel)]
    if len(extra) < args.wheel_count:
        raise SystemExit(f"only {len(extra)} functions with docstrings found in {', '.join(args.wheel) or 'no wheel'}")
    if len(extra) < args.chat_wheel_count:
        raise SystemExit(f"only {len(extra)} functions with docstrings for --chat-wheel-count {args.chat_wheel_count}")
    picked += [p["code"] for p in spread(extra, args.wheel_count)]
    # Skip the first half step of the chats' spacing so that they mostly ask about other functions
    # than the code prompts' (the exact slice is kept: data made from these prompts depends on it).
    chats += function_chats(extra[len(extra) // max(2 * args.chat_wheel_count, 1):], args.chat_wheel_count)
    with open(args.out, "w", encoding="utf-8") as f:
        for p in picked:
            f.write(json.dumps({"prompt": p}) + "\n")
        for p in chats:
            f.write(json.dumps({"prompt": p, "chat": True}) + "\n")
    print(f"wrote {args.out}: {len(picked)} code and {len(chats)} chat prompts from {len(prompts)} stdlib functions in {stdlib}"
          f" and {len(extra)} functions in {len(args.wheel)} wheel(s)")


if __name__ == "__main__":
    main()
