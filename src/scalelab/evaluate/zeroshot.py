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


def _shared_contexts(lm: EvalLM, groups: list[tuple[list[int], list[list[int]]]], batch_size: int) -> list[list[float]]:
    """Σ log p(x | c) for every continuation x of every group (c, [x, ...]), each context computed once.

    Per batch of groups: the contexts (right-padded) in one forward that keeps the key/value cache and the logits of
    each context's last position (the first continuation token's prediction); then the cache row of each context is
    repeated for its continuations, and all continuations of the batch (right-padded) run on it in one forward, with
    positions continuing each context's own length. Causal attention makes this the same computation as scoring
    c + x in one row: only padding, masked out, differs."""
    out: list[list[float]] = [[] for _ in groups]
    order = sorted(range(len(groups)), key=lambda g: -len(groups[g][0]))
    per_batch = max(1, batch_size // max(len(x) for _, x in groups))  # about batch_size continuation rows a forward
    for b in range(0, len(order), per_batch):
        idx = order[b: b + per_batch]
        ctx = [groups[g][0] for g in idx]
        width = max(map(len, ctx))
        ids, mask = torch.zeros(len(idx), width, dtype=torch.long), torch.zeros(len(idx), width, dtype=torch.long)
        for row, c in enumerate(ctx):
            ids[row, : len(c)], mask[row, : len(c)] = torch.tensor(c), 1
        lasts = sorted({len(c) - 1 for c in ctx})
        logits, cache = lm.extend(ids, mask, torch.arange(width).expand(len(idx), -1), None, torch.tensor(lasts))
        first = logits[torch.arange(len(idx)), torch.tensor([lasts.index(len(c) - 1) for c in ctx])]  # [B, V]
        rows = [(row, x) for row, g in enumerate(idx) for x in groups[g][1]]
        src = torch.tensor([row for row, _ in rows])
        scores = _picked(first[src], torch.tensor([x[0] for _, x in rows], device=first.device))
        tail = max(len(x) for _, x in rows) - 1  # the continuations' own tokens, less the last: predictions of x[1:]
        if tail > 0:
            cache.batch_select_indices(src.to(lm.device))
            xs, xmask = torch.zeros(len(rows), tail, dtype=torch.long), torch.zeros(len(rows), tail, dtype=torch.long)
            for r, (_, x) in enumerate(rows):
                xs[r, : len(x) - 1], xmask[r, : len(x) - 1] = torch.tensor(x[:-1]), 1
            pos = torch.tensor([len(ctx[row]) for row, _ in rows])[:, None] + torch.arange(tail)
            logits, _ = lm.extend(xs, torch.cat([mask[src], torch.ones_like(xmask)], dim=1), pos, cache)
            valid = xmask.bool()
            targets = torch.cat([torch.tensor(x[1:], dtype=torch.long) for _, x in rows])
            picked = _picked(logits[valid.to(logits.device)], targets.to(logits.device))
            scores = scores + torch.zeros(len(rows), tail, device=picked.device).masked_scatter(
                valid.to(picked.device), picked).sum(dim=1)
        for r, (row, _) in enumerate(rows):
            out[idx[row]].append(float(scores[r]))
    return out


@torch.inference_mode()
def loglikelihoods(lm: EvalLM, requests: list[tuple[str, str]], batch_size: int = 32,
                   shared: bool = True) -> list[tuple[float, int]]:
    """(Σ log p(continuation tokens | context), UTF-8 bytes scored) per (context, continuation), as `_encode` says.

    With `shared` and a model that keeps a cache (`lm.extend`), the requests of one context that fit the model's
    length whole are scored on that context computed once (`_shared_contexts`); the others, or all without,
    as one full sequence each (`_full_sequences`). Both give the same numbers to float rounding."""
    enc = [_encode(lm, ctx, cont) for ctx, cont in requests]
    out: list[float | None] = [None] * len(requests)
    if shared and lm.extend is not None:
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
