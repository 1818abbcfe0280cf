"""Zero-shot multiple choice built offline from the validation split: no downloads, the same items for every model.

Two tasks, each item has `choices` candidates, exactly one true; chance = 1/choices (the candidates' order is a
seeded permutation, so a model that cannot tell them apart scores chance in expectation):
- continuation (HellaSwag-style): the raw text before a spoken line is the context; the candidates are that line
  and lines drawn from elsewhere in the split. Scored as lm-evaluation-harness's `acc_norm`: the log-likelihood of
  the candidate given the context divided by its length in UTF-8 bytes (tokenizer-independent); `acc` (unnormalised
  sum) is reported too.
- cloze: a word (≥ 4 letters) of a spoken line is replaced by words of similar corpus frequency (so a unigram prior
  cannot pick the true one); the candidates are the whole line with each word; scored by the log-likelihood of the
  line given the context (all candidates share the rest of the line, so no length normalisation).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from scalelab.evaluate.lm import EvalLM

WORD = re.compile(r"[A-Za-z]{4,}")


@dataclass(frozen=True)
class Item:
    context: str
    choices: tuple[str, ...]
    answer: int  # index of the true candidate


MAX_LINE = 60  # characters: a candidate line must fit short models' windows beside some context


def spoken_lines(docs: list[str]) -> list[tuple[int, int, int]]:
    """(doc, start, end) of every line of speech: ≥ 4 words, 20 to MAX_LINE characters, starting with a letter (not
    a heading, speaker, stage direction or list), with text before it in its document."""
    spans = []
    for d, doc in enumerate(docs):
        start = 0
        for line in doc.split("\n"):
            text = line.rstrip()
            if start > 0 and 20 <= len(text) <= MAX_LINE and len(text.split()) >= 4 and text[:1].isalpha():
                spans.append((d, start, start + len(text)))
            start += len(line) + 1
    return spans


def _context(doc: str, start: int, chars: int) -> str:
    """Up to `chars` characters before `start`, cut at a line boundary."""
    lo = max(0, start - chars)
    if lo > 0 and (nl := doc.find("\n", lo, start)) != -1:
        lo = nl + 1
    return doc[lo:start]


def _shuffle(rng: np.random.Generator, truth: str, others: list[str]) -> tuple[tuple[str, ...], int]:
    order = rng.permutation(len(others) + 1)
    choices = [truth, *others]
    return tuple(choices[i] for i in order), int(np.flatnonzero(order == 0)[0])


def continuation_items(docs: list[str], n: int, k: int, context_chars: int, seed: int) -> list[Item]:
    rng = np.random.default_rng([seed, 1])
    spans = spoken_lines(docs)
    pool = sorted({docs[d][s:e] for d, s, e in spans})
    if len(pool) < k or not spans:
        raise ValueError(f"the validation split has {len(pool)} distinct lines of speech: too few for {k} choices")
    items = []
    for i in rng.choice(len(spans), size=min(n, len(spans)), replace=False):
        d, s, e = spans[i]
        truth = docs[d][s:e]
        others: list[str] = []
        while len(others) < k - 1:
            cand = pool[rng.integers(len(pool))]
            if cand != truth and cand not in others:
                others.append(cand)
        choices, answer = _shuffle(rng, truth, others)
        items.append(Item(_context(docs[d], s, context_chars), choices, answer))
    return items


def cloze_items(docs: list[str], n: int, k: int, context_chars: int, seed: int) -> list[Item]:
    rng = np.random.default_rng([seed, 2])
    counts = Counter(w.lower() for doc in docs for w in WORD.findall(doc))
    vocab = [w for w, _ in counts.most_common()]  # by frequency, ties in first-seen order: deterministic
    rank = {w: r for r, w in enumerate(vocab)}
    band = max(10 * k, 40)  # distractors from this many neighbours in frequency rank
    if len(vocab) < k + 1:
        raise ValueError(f"the validation split has {len(vocab)} distinct words: too few for {k} choices")
    spans = [sp for sp in spoken_lines(docs) if WORD.search(docs[sp[0]][sp[1]:sp[2]])]
    items = []
    for i in rng.choice(len(spans), size=min(n, len(spans)), replace=False):
        d, s, e = spans[i]
        line = docs[d][s:e]
        words = list(WORD.finditer(line))
        m = words[rng.integers(len(words))]
        word, r = m.group(), rank[m.group().lower()]
        near = [w for w in vocab[max(0, r - band // 2): r + band // 2 + 1] if w != word.lower()]
        others = [str(w) for w in rng.choice(near, size=k - 1, replace=False)]
        others = [w.capitalize() if word[0].isupper() else w for w in others]
        fill = lambda w: line[: m.start()] + w + line[m.end():]  # noqa: E731
        choices, answer = _shuffle(rng, fill(word), [fill(w) for w in others])
        items.append(Item(_context(docs[d], s, context_chars), choices, answer))
    return items


Encoded = tuple[list[int], int, int]  # (token ids scored as one sequence, tokens scored at its end, bytes scored)


def _encode(lm: EvalLM, ctx: str, cont: str) -> tuple[list[int], list[int], Encoded]:
    """Context and continuation encoded each on its own (as lm-eval does), and the sequence scored without a shared
    context: the context cut from the left to fit the model's length; a continuation longer than that keeps only its
    last tokens, and the bytes count only what was scored."""
    c, x = lm.encode(ctx), lm.encode(cont)
    if not x:
        raise ValueError(f"empty continuation after tokenization: {cont!r}")
    seq = (c + x)[-(lm.max_len + 1):]
    n = min(len(x), len(seq) - 1)
    if n < 1:
        raise ValueError(f"no context before {cont!r}: its first token cannot be scored")
    scored = cont if n == len(x) else lm.tokenizer.decode(x[-n:])
    return c, x, (seq, n, len(scored.encode()))


def _picked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) at each row of logits [N, V]: the target's logit less the row's log-sum-exp (log_softmax read at
    one entry, without materialising the rest)."""
    return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def _full_sequences(lm: EvalLM, encoded: list[Encoded], batch_size: int) -> list[float]:
    """Σ log p(last n tokens | the rest) of each sequence, one row each, similar lengths in a batch."""
    out = [0.0] * len(encoded)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][0]))
    for b in range(0, len(order), batch_size):
        idx = order[b: b + batch_size]
        width = max(len(encoded[i][0]) for i in idx) - 1
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            seq = encoded[i][0]
            ids[row, : len(seq) - 1] = torch.tensor(seq[:-1])
        logits = lm.logits(ids)
        for row, i in enumerate(idx):
            seq, n, _ = encoded[i]
            pos = torch.arange(len(seq) - 1 - n, len(seq) - 1)  # predictions of the continuation's tokens
            out[i] = float(_picked(logits[row, pos], torch.tensor(seq[-n:], device=logits.device)).sum())
    return out


def _tree(xs: list[list[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """The inputs x[:-1] of the continuations `xs` as a prefix tree (a prefix two of them share is one node): each
    node's token, parent (-1: the context) and depth; and for each continuation the node whose output predicts each
    of its tokens (-1: the context's last position)."""
    index: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parent: list[int] = []
    depth: list[int] = []
    reads = []
    for x in xs:
        at, path = -1, [-1]
        for k, t in enumerate(x[:-1]):
            if (at, t) not in index:
                index[at, t] = len(tokens)
                tokens.append(t)
                parent.append(at)
                depth.append(k)
            at = index[at, t]
            path.append(at)
        reads.append(path)
    return tokens, parent, depth, reads


def _place(ids, pos, allowed, r: int, c: list[int], tree: tuple[list[int], list[int], list[int], list]) -> None:
    """Row `r`: the context `c` (causal), then the tree's nodes, each at position len(c) + its depth, attending to
    the whole context, itself and its ancestors."""
    (tokens, parent, depth, _), n, m = tree, len(c), len(tree[0])
    ids[r, :n], pos[r, :n] = torch.tensor(c), torch.arange(n)
    allowed[r, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    if m:
        ids[r, n: n + m], pos[r, n: n + m] = torch.tensor(tokens), n + torch.tensor(depth)
        lineage = torch.eye(m, dtype=torch.bool)
        for j, p in enumerate(parent):  # a parent comes before its children
            if p >= 0:
                lineage[j] |= lineage[p]
        allowed[r, n: n + m, :n] = True
        allowed[r, n: n + m, n: n + m] = lineage


def _shared_contexts(lm: EvalLM, groups: list[tuple[list[int], list[list[int]]]], batch_size: int) -> list[list[float]]:
    """Σ log p(x | c) for every continuation x of every group (c, [x, ...]), each context and each prefix its
    continuations share computed once: one row per group, `batch_size` rows a forward (`lm.masked`).

    A row is the context, then the tree of its continuations' inputs (`_tree`); a node sits at position len(c) + its
    depth and attends to the context and to its own ancestors in the tree, never to another branch. So each token
    sees exactly what it sees in the row c + x, at the same positions: the same computation as one sequence per
    continuation, up to float rounding, without the repeated context, prefixes or padding. The vocabulary projection
    runs only where a token is predicted: the context's last position and the nodes."""
    trees = [_tree(xs) for _, xs in groups]
    size = [len(c) + len(t[0]) for (c, _), t in zip(groups, trees)]
    out: list[list[float]] = [[] for _ in groups]
    order = sorted(range(len(groups)), key=lambda g: -size[g])  # similar lengths in a forward: little padding
    for b in range(0, len(order), batch_size):
        idx = order[b: b + batch_size]
        width = max(size[g] for g in idx)
        ids, pos = torch.zeros(len(idx), width, dtype=torch.long), torch.zeros(len(idx), width, dtype=torch.long)
        allowed = torch.eye(width, dtype=torch.bool).repeat(len(idx), 1, 1)  # padding sees itself: no empty row
        rows, cols = [], []  # the positions read: each row's context's last, then its nodes
        at, targets, owner = [], [], []  # per scored token: where it is predicted (among those read), itself, whose
        for r, g in enumerate(idx):
            _place(ids, pos, allowed, r, groups[g][0], trees[g])
            n, first, m = len(groups[g][0]), len(rows), len(trees[g][0])
            rows += [r] * (m + 1)
            cols += range(n - 1, n + m)
            for x, path in zip(groups[g][1], trees[g][3]):  # each x has a token (_encode)
                at += [first + 1 + node for node in path]
                targets += x
                owner += [owner[-1] + 1 if owner else 0] * len(x)
        logits = lm.masked(ids, allowed, pos, torch.tensor(rows), torch.tensor(cols))
        at_, dev = torch.tensor(at, device=logits.device), logits.device
        picked = logits[at_, torch.tensor(targets, device=dev)] - torch.logsumexp(logits, dim=-1)[at_]  # log p
        sums = torch.zeros(owner[-1] + 1, dtype=picked.dtype, device=dev).index_add_(
            0, torch.tensor(owner, device=dev), picked).tolist()
        for g in idx:  # the continuations' sums in the order of the groups, then of their continuations
            out[g], sums = sums[: len(groups[g][1])], sums[len(groups[g][1]):]
    return out


@torch.inference_mode()
def loglikelihoods(lm: EvalLM, requests: list[tuple[str, str]], batch_size: int = 32,
                   shared: bool = True) -> list[tuple[float, int]]:
    """(Σ log p(continuation tokens | context), UTF-8 bytes scored) per (context, continuation), as `_encode` says.

    With `shared` and a model that takes an explicit attention mask (`lm.masked`), the requests of one context that
    fit the model's length whole are scored in one row, the context computed once (`_shared_contexts`); the others,
    or all without, as one full sequence each (`_full_sequences`). Both give the same numbers to float rounding."""
    enc = [_encode(lm, ctx, cont) for ctx, cont in requests]
    out: list[float | None] = [None] * len(requests)
    if shared and lm.masked is not None:
        by_ctx: dict[str, list[int]] = {}
        for i, (ctx, _) in enumerate(requests):
            c, x, _ = enc[i]
            if c and len(c) + len(x) - 1 <= lm.max_len:  # nothing cut: the shared context is the whole context
                by_ctx.setdefault(ctx, []).append(i)
        keys = list(by_ctx)
        groups = [(enc[by_ctx[k][0]][0], [enc[i][1] for i in by_ctx[k]]) for k in keys]
        for k, scores in zip(keys, _shared_contexts(lm, groups, batch_size) if groups else []):
            for i, v in zip(by_ctx[k], scores):
                out[i] = v
    rest = [i for i, v in enumerate(out) if v is None]
    for i, v in zip(rest, _full_sequences(lm, [enc[i][2] for i in rest], batch_size) if rest else []):
        out[i] = v
    return [(float(v), e[2][2]) for v, e in zip(out, enc)]


def choice_scores(lm: EvalLM, items: list[Item], batch_size: int = 32,
                  shared: bool = True) -> list[list[tuple[float, int]]]:
    """(Σ log p(candidate | context), bytes scored) for every candidate of every item."""
    flat = loglikelihoods(lm, [(it.context, ch) for it in items for ch in it.choices], batch_size, shared)
    out, at = [], 0
    for it in items:
        out.append(flat[at: at + len(it.choices)])
        at += len(it.choices)
    return out


def accuracy(items: list[Item], scores: list[list[tuple[float, int]]], normalize: bool) -> dict[str, float]:
    """Accuracy of argmax over candidates (first on ties; per UTF-8 byte with `normalize`), its binomial standard
    error, and the chance rate."""
    correct = 0
    for it, s in zip(items, scores):
        values = [v / max(n_bytes, 1) if normalize else v for v, n_bytes in s]
        correct += int(np.argmax(values) == it.answer)
    acc = correct / len(items)
    return {"acc": acc, "stderr": math.sqrt(acc * (1 - acc) / len(items)), "n": len(items),
            "chance": 1 / len(items[0].choices)}


def run_tasks(lm: EvalLM, docs: list[str], *, items: int, choices: int, context_chars: int, seed: int,
              batch_size: int = 32) -> dict[str, dict[str, float]]:
    """Both tasks: `continuation` (acc_norm, the headline), `continuation_raw` (acc) and `cloze`."""
    cont = continuation_items(docs, items, choices, context_chars, seed)
    cloze = cloze_items(docs, items, choices, context_chars, seed)
    cont_scores = choice_scores(lm, cont, batch_size)
    return {"continuation": accuracy(cont, cont_scores, normalize=True),
            "continuation_raw": accuracy(cont, cont_scores, normalize=False),
            "cloze": accuracy(cloze, choice_scores(lm, cloze, batch_size), normalize=False)}
