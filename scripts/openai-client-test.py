#!/usr/bin/env python3
"""Drives a running `domino serve` with the official `openai` Python client.

    python3 scripts/openai-client-test.py http://127.0.0.1:8080

Checks: models.list, a non-streamed chat completion (usage, finish_reason), the same request
streamed with include_usage (same text, role first, usage chunk last), a legacy completion, a
seeded sampled request reproduced, and the client's typed errors for a 400 (n=2) and a 404.
Exits non-zero with a message on the first mismatch (run by crates/cli/tests/serve.rs).
"""
import sys

import openai

url = sys.argv[1].rstrip("/")
client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def check(cond, what):
    if not cond:
        print("FAILED:", what, file=sys.stderr)
        sys.exit(1)


models = client.models.list()
check(len(models.data) == 1 and models.data[0].object == "model", f"models.list: {models}")
model = models.data[0].id

messages = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Say something"}]},
]
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
check(whole.object == "chat.completion", f"object: {whole.object}")
choice = whole.choices[0]
check(choice.message.role == "assistant", "role")
check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
check(whole.usage.completion_tokens >= 1 and whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens, f"usage {whole.usage}")

chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}))
check(chunks[0].choices[0].delta.role == "assistant", "first chunk carries the role")
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(text == (choice.message.content or ""), f"streamed {text!r} != whole {choice.message.content!r}")
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(finishes == [choice.finish_reason], f"finish reasons {finishes}")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens, f"usage chunk {chunks[-1]}")
# The repeated prompt came from the prefix cache (all of it but the last token), parsed by the client.
details = chunks[-1].usage.prompt_tokens_details
check(details is not None and details.cached_tokens == whole.usage.prompt_tokens - 1, f"cached tokens {details}")

completion = client.completions.create(model=model, prompt="The sea is", max_tokens=8, temperature=0)
check(completion.object == "text_completion" and isinstance(completion.choices[0].text, str), f"completion {completion}")
check(completion.usage.completion_tokens == 8 or completion.choices[0].finish_reason == "stop", f"completion usage {completion.usage}")

a = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0.9, seed=42)
b = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0.9, seed=42)
check(a.choices[0].message.content == b.choices[0].message.content, "a seed reproduces its sample")

try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=2)
    check(False, "n=2 must be refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "n" in str(e), f"n=2: {e}")

try:
    client.with_options(base_url=url + "/v2").models.list()
    check(False, "an unknown route must be a 404")
except openai.NotFoundError as e:
    check(e.status_code == 404, f"404: {e}")

print("openai client: all checks passed")
