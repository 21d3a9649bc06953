#!/usr/bin/env python3
"""Offline simulation of prompt lookup with and without a static n-gram table (docs/performance.md,
"A static n-gram table for prompt lookup").

Inputs are `domino train data` folders (only their tokens are read): EVAL, the target's greedy
continuations of the prompts to evaluate on (e.g. the first 40 HumanEval prompts, --max-new-tokens
64), and CORPUS, its continuations of other prompts (the table is built from them as `domino train
ngrams` builds it). Every position of EVAL's continuations is a round: the text's match (longest
1-3 token suffix seen before, the latest occurrence's continuation) and the table's proposal (the
longest 2-4 token context, chained), each with the tokens it would get accepted. A policy verifies
a fixed k per class (text match length; table context length x confidence class), text first; the
best policy per configuration is found by coordinate ascent on the whole set (in hindsight, so an
upper bound of what an online schedule finds). Speed is total plain time over total round time on
the verify-only costs below (this machine's calibration, ms for k = 0..8).

    python3 scripts/simulate-lookup-table.py EVAL_DIR CORPUS_DIR [--min-count 1] [--with-prompts]
"""
import argparse, collections, glob, json, struct

COST = [49.5, 62.5, 73.9, 96.4, 110.6, 130.7, 141.9, 154.6, 191.7]
MAX_K = 8


def read_seqs(d):
    out = []
    for f in sorted(glob.glob(d + '/shard-*.safetensors')):
        b = open(f, 'rb').read()
        n = struct.unpack('<Q', b[:8])[0]
        h = json.loads(b[8:8 + n])
        lens = [int(x) for x in h['__metadata__']['prompt_lens'].split(',')]
        for j, pl in enumerate(lens):
            s, e = h[f'seq.{j}.tokens']['data_offsets']
            raw = b[8 + n + s:8 + n + e]
            out.append((list(struct.unpack(f'<{len(raw) // 4}I', raw)), pl))
    return out


def build_table(seqs, min_count, with_prompts):
    counts = collections.defaultdict(collections.Counter)
    for toks, pl in seqs:
        text = toks if with_prompts else toks[pl:]
        for i in range(2, len(text)):
            for n in range(2, min(4, i) + 1):
                counts[tuple(text[i - n:i])][text[i]] += 1
    table = {}
    for ctx, c in counts.items():
        total = sum(c.values())
        tok, m = min(c.items(), key=lambda kv: (-kv[1], kv[0]))
        if m >= min_count:
            table[ctx] = (tok, m / (total + 1))
    return table


def table_propose(table, ctx):
    def longest(c):
        for n in range(4, 1, -1):
            if len(c) >= n and tuple(c[-n:]) in table:
                return n, table[tuple(c[-n:])]
        return None
    first = longest(ctx)
    if not first:
        return None
    n, (tok, conf) = first
    out, c = [tok], list(ctx[-4:]) + [tok]
    while len(out) < MAX_K:
        nxt = longest(c)
        if not nxt:
            break
        out.append(nxt[1][0])
        c.append(nxt[1][0])
    return ('table', n, 0 if conf < 0.5 else 1 if conf < 0.8 else 2), out


def text_propose(ctx):
    t = len(ctx)
    for n in range(3, 0, -1):
        if t < n:
            continue
        suf = ctx[-n:]
        for s in range(t - n - 1, -1, -1):
            if ctx[s:s + n] == suf:
                return ('text', n), ctx[s + n:min(t, s + n + MAX_K)]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('eval_dir')
    ap.add_argument('corpus_dir')
    ap.add_argument('--min-count', type=int, default=1)
    ap.add_argument('--with-prompts', action='store_true')
    a = ap.parse_args()
    evals, corpus = read_seqs(a.eval_dir), read_seqs(a.corpus_dir)
    table = build_table(corpus, a.min_count, a.with_prompts)
    print(f'table: {len(table)} contexts from {len(corpus)} sequences')
    rounds = []  # per sequence: per position, [(class, accepted, proposed length)]
    for toks, pl in evals:
        seq = []
        for t in range(pl, len(toks)):
            cands = []
            for prop in (text_propose(toks[:t]), table_propose(table, toks[:t])):
                if prop:
                    cls, p = prop
                    acc = 0
                    while acc < len(p) and t + acc < len(toks) and toks[t + acc] == p[acc]:
                        acc += 1
                    cands.append((cls, acc, len(p)))
            seq.append(cands)
        rounds.append((pl, len(toks), seq))
    classes = sorted({c for _, _, seq in rounds for cands in seq for c, _, _ in cands}, key=str)

    def speed(policy, use):
        total = plain = 0.0
        for pl, end, seq in rounds:
            t = pl
            while t < end:
                pick = next((c for c in seq[t - pl] if c[0][0] in use and policy.get(c[0], 0) > 0), None)
                if pick:
                    k = min(policy[pick[0]], pick[2])
                    total += COST[k]
                    t += min(pick[1], k) + 1
                else:
                    total += COST[0]
                    t += 1
            plain += COST[0] * (end - pl)
        return plain / total

    for label, use in [('text matches only', {'text'}), ('table only', {'table'}), ('text, then the table', {'text', 'table'})]:
        policy = {c: 0 for c in classes}
        best = speed(policy, use)
        for _ in range(3):
            for c in classes:
                for k in range(MAX_K + 1):
                    old, policy[c] = policy[c], k
                    v = speed(policy, use)
                    if v > best + 1e-9:
                        best = v
                    else:
                        policy[c] = old
        print(f'{label:22s} {best:.3f}x plain  k per class: {({c: k for c, k in policy.items() if k})}')


if __name__ == '__main__':
    main()
