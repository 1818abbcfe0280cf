"""The parity probe's ledger and tables, from the hd-parity study's committed cells (configs/studies/hd-parity.yaml):
does Hidden Decoding's extra width at the answer solve a parity that one stream cannot, where pause tokens (the
positive control) do?

Each cell of the study is one arm at one K (its `bits`; the study's params.yaml, the profile it ran under, says which),
its metrics the answer token's loss and accuracy on validation windows of whole blocks (scalelab.hidden_decoding.parity_task;
floor 0, blind ln 2). An arm is what a cell is but its K: `n1`, `pause` (one stream, K pause tokens before the
answer), `pause_hints` (the same, its pauses trained on threshold hints), `n2`, `n4` (SFA), `n2full`, `n4full` (full
attention), each of those with `cont` when continued from a one-stream backbone it trained first (`backbone_steps`,
the same steps in all). The positive control is `pause_hints` where a study runs it, else `pause`. What a seed's arm solves is read two ways:
    largest K solved     the largest K of the ladder with answer accuracy ≥ SOLVED (the table; an integer per seed)
    solved score         Σ over the K ladder of the fraction of the blind → floor answer gap closed,
                         (ln 2 − loss_K) / ln 2: a continuous count of K's solved, the claims' metric (an integer
                         count ties across seeds, which the ledger's rule cannot read)
Claims: n > 1 solves more than n = 1 (SFA and full attention at each n, from scratch and continued); the gain grows
from n = 2 to n = 4; SFA keeps ≥ sfa_fraction of full attention's gain. A seed of an arm solves the probe's largest K
or stays at chance there (solve-or-fail), so each claim is decided on the counts of seeds that solve it
(scalelab.ledger.claims.count_claim, rule 5: Fisher's exact test and exact Clopper–Pearson bounds), not by a t
interval on the solved score, whose per-seed values are 0 or the ladder's length but for rounding. Premises at the K
compared (the ladder's largest; hd_premises.parity_premises): room (n = 1 stays near ln 2) and the positive control
(the pause arm solves it in every seed); for the growth and SFA claims also the gain they are measured against, shown
by the same exact test. The smallest effect of interest: hidden_decoding.SOLVE_SESOI (a solve rate).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path

from scalelab.ledger import claims as ledger
from scalelab.hidden_decoding import premises as hdp
from scalelab.hidden_decoding import ledger as hdr
from scalelab.ledger.studies import cell_files
from scalelab.config import CellConfig, HiddenDecodingConfig

PAUSE, HINTED = "pause", "pause_hints"  # the pause arms; the positive control is the hinted one where it ran
BLIND = math.log(2)
Cells = dict[str, dict[int, dict[int, dict]]]  # arm → K → seed → metrics


def arm_of(c: CellConfig) -> str:
    """The arm a cell belongs to: what it is but its K."""
    if c.pauses:
        return HINTED if c.hints else PAUSE
    tags = [c.attention if c.attention != "sfa" else "", c.tables if c.tables != "separate" else "",
            c.start if c.start != "open" else "", "cont" if c.backbone_steps else ""]
    return f"n{c.n_streams}{''.join(tags)}"


def closed(answer_loss: float) -> float:
    """The fraction of the blind (ln 2) → floor (0) gap of the answer token a loss closes."""
    return (BLIND - answer_loss) / BLIND


def config(folder: Path) -> HiddenDecodingConfig:
    """The hidden_decoding section a study's cells ran under (its params.yaml, written by `scalelab study`)."""
    from scalelab.config import load_params

    hd = load_params(Path(folder) / "params.yaml").hidden_decoding
    if hd is None or hd.train.corpus != "parity":
        raise ValueError(f"{folder}/params.yaml: not a parity probe (hidden_decoding.train.corpus parity)")
    return hd


def study_files(folder: Path) -> dict[str, Path]:
    """A study's committed cell metrics by file name (what the stage writes to metrics/hidden_decoding)."""
    return cell_files(Path(folder), "metrics/hidden_decoding", ".json")


def read_cells(hd: HiddenDecodingConfig, files: Mapping[str, Path]) -> tuple[Cells, dict[str, CellConfig]]:
    """arm → K → seed → metrics of the cells' metrics `files` (<cell>-<seed>.json; each checked against its cell's
    params, files of cells not in `hd.cells` ignored), and each arm's cell config (one of its cells')."""
    out, arms = {}, {}
    for path in files.values():
        m = json.loads(Path(path).read_text())
        c = hd.cells.get(m.get("cell"))
        if c is None:
            continue
        if (m.get("bits"), m.get("pauses"), m.get("hints", False)) != (c.bits, c.pauses, c.hints) \
                or "answer_loss" not in m:
            raise ValueError(f"{path}: not the parity cell {m.get('cell')!r} of the params (bits, pauses, hints, "
                             "answers)")
        arms.setdefault(arm_of(c), c)
        out.setdefault(arm_of(c), {}).setdefault(c.bits, {})[int(m["seed"])] = m
    return out, arms


def ladder(cells: Cells) -> list[int]:
    """The K ladder: every K some arm ran."""
    return sorted({K for by_k in cells.values() for K in by_k})


def seeds_of(cells: Cells, arm: str, ks: list[int]) -> list[int]:
    """The seeds `arm` ran at every K of the ladder."""
    by_k = cells.get(arm, {})
    return sorted(set.intersection(*(set(by_k.get(K, {})) for K in ks))) if ks else []


def score(cells: Cells, arm: str, seed: int, ks: list[int]) -> float:
    """The solved score: Σ over the K ladder of the fraction of the answer gap closed."""
    return sum(closed(cells[arm][K][seed]["answer_loss"]) for K in ks)


def largest_solved(cells: Cells, arm: str, seed: int, ks: list[int]) -> int | None:
    """The largest K of the ladder solved (answer accuracy ≥ SOLVED); None when none is."""
    solved = [K for K in ks if cells[arm][K][seed]["answer_acc"] >= hdp.SOLVED]
    return max(solved) if solved else None


def gains(cells: Cells, arms: dict[str, CellConfig], ks: list[int]) -> dict[str, dict[int, list[float]]]:
    """Per-seed solved(arm) − solved(n = 1) of the Hidden Decoding arms (separate tables, the open start), by
    attention ("sfa", "full"; "sfa_cont", "full_cont" continued from a one-stream backbone) and n, paired by seed."""
    if "n1" not in cells:
        raise ValueError("the parity probe needs its n = 1 arm")
    out: dict[str, dict[int, list[float]]] = {"sfa": {}, "full": {}, "sfa_cont": {}, "full_cont": {}}
    for arm, c in sorted(arms.items()):
        cont = "cont" if c.backbone_steps else ""
        if c.n_streams > 1 and arm == f"n{c.n_streams}{'' if c.attention == 'sfa' else c.attention}{cont}":
            seeds = [s for s in seeds_of(cells, arm, ks) if s in seeds_of(cells, "n1", ks)]
            kind = f"{c.attention}_cont" if cont else c.attention
            out[kind][c.n_streams] = [score(cells, arm, s, ks) - score(cells, "n1", s, ks) for s in seeds]
    return out


def solved_count(cells: Cells, arm: str, K: int, seeds: list[int]) -> tuple[int, int]:
    """(seeds of `seeds` in which `arm` solves K: answer accuracy ≥ SOLVED, seeds)."""
    return sum(cells[arm][K][s]["answer_acc"] >= hdp.SOLVED for s in seeds), len(seeds)


def count_shown(name: str, treated: tuple[int, int], control: tuple[int, int], level: float, need: str) -> dict:
    """The premise that a solve-count gain is there: Fisher's exact one-sided p < (1 − level)/2 (the claims' test)."""
    p = ledger.fisher_greater(treated, control)
    return ledger.premise(name, f"{treated[0]}/{treated[1]} against {control[0]}/{control[1]} seeds (Fisher p = "
                          f"{p:.3g})", p < (1 - level) / 2, f"{need} (Fisher's exact p < {(1 - level) / 2:g})")


def control(cells: Cells) -> str:
    """The positive control's arm: the hinted pause arm where the study ran it, else the plain one."""
    return HINTED if HINTED in cells else PAUSE


def premises(cells: Cells, ks: list[int]) -> list[dict]:
    """Room and the positive control at the K compared (the ladder's largest)."""
    K, arm = max(ks), control(cells)
    pause = [m["answer_acc"] for _, m in sorted(cells.get(arm, {}).get(K, {}).items())]
    return hdp.parity_premises(K, pause, [closed(m["answer_loss"]) for _, m in sorted(cells["n1"][K].items())],
                               hints=arm == HINTED)


def regime(cells: Cells, n: int, ks: list[int]) -> dict:
    one = next(iter(cells["n1"][max(ks)].values()))
    return hdp.regime(n, params=one["params"], non_embedding_params=None, tokens=one["tokens"], steps=one["steps"],
                      probe=True)


def study(folder: Path) -> list[dict]:
    """The hd-parity study's ledger (its spec's generator), from its params.yaml and committed cells."""
    return entries(config(folder), study_files(folder))


def entries(hd: HiddenDecodingConfig, files: Mapping[str, Path]) -> list[dict]:
    """The ledger, on the counts of seeds that solve the ladder's largest K: n > 1 solves it in more seeds than
    n = 1, with SFA and with full attention; the gain grows with n (SFA); SFA keeps ≥ sfa_fraction of full attention's
    solve rate (n = 1 solving it in no seed where the room premise holds, the rate is the gain)."""
    cells, arms = read_cells(hd, files)
    ks = ladder(cells)
    K = max(ks)
    level, f = hd.claims.level, hd.claims.sfa_fraction
    base = premises(cells, ks)
    metric = f"rate of seeds solving K = {K} (answer accuracy ≥ {hdp.SOLVED}): "

    def entry(id, text, metric, treated, ctrl, n, extra=(), published=hdr.PUBLISHED, factor=1.0):
        # "keeps ≥ f of" is a claim of non-inferiority: a shortfall under the smallest effect does not matter
        return ledger.count_claim(id, f"parity probe: {text}", metric, treated, ctrl, published, level,
                                  regime=regime(cells, n, ks), premises=[*base, *extra],
                                  smallest_effect=hdr.SOLVE_SESOI, factor=factor, non_inferiority=factor != 1)

    def pair(arm: str, ref: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """Both arms' counts on the seeds both ran at every K of the ladder."""
        seeds = [s for s in seeds_of(cells, arm, ks) if s in seeds_of(cells, ref, ks)]
        return solved_count(cells, arm, K, seeds), solved_count(cells, ref, K, seeds)

    hd_arms: dict[str, dict[int, str]] = {"sfa": {}, "full": {}, "sfa_cont": {}, "full_cont": {}}
    for arm, c in sorted(arms.items()):  # the arms `gains` compares with n = 1 (separate tables, the open start)
        cont = "cont" if c.backbone_steps else ""
        if c.n_streams > 1 and arm == f"n{c.n_streams}{'' if c.attention == 'sfa' else c.attention}{cont}":
            hd_arms[f"{c.attention}_cont" if cont else c.attention][c.n_streams] = arm
    if "n1" not in cells:
        raise ValueError("the parity probe needs its n = 1 arm")
    out = []
    for kind, label, tag in (("sfa", "SFA", ""), ("full", "full attention", "full."),
                             ("sfa_cont", "SFA, continued from n = 1", "cont."),
                             ("full_cont", "full attention, continued from n = 1", "cont.full.")):
        for n, arm in sorted(hd_arms[kind].items()):
            out.append(entry(f"C.parity.gain.{tag}n{n}", f"n = {n} ({label}) solves K = {K} in more seeds than n = 1",
                             metric + f"{arm} − n1", *pair(arm, "n1"), n,
                             published=hdr.PUBLISHED if kind.startswith("sfa") else hdr.PUBLISHED_SFA))
    ns = sorted(hd_arms["sfa"])
    for lo, hi in zip(ns, ns[1:]):
        ref = count_shown(f"gain at n = {lo}", *pair(hd_arms["sfa"][lo], "n1"), level,
                          f"n = {lo} solves K = {K} in more seeds than n = 1")
        out.append(entry(f"C.parity.grows.n{lo}-n{hi}", f"the gain grows with n: n = {hi} solves K = {K} in more "
                         f"seeds than n = {lo}", metric + f"n = {hi} − n = {lo}",
                         *pair(hd_arms["sfa"][hi], hd_arms["sfa"][lo]), hi, [ref]))
    for n in sorted(set(hd_arms["sfa"]) & set(hd_arms["full"])):
        ref = count_shown(f"full attention's gain at n = {n}", *pair(hd_arms["full"][n], "n1"), level,
                          f"full attention at n = {n} solves K = {K} in more seeds than n = 1")
        out.append(entry(f"C.parity.sfa.n{n}", f"SFA keeps ≥ {f:.0%} of full attention's solve rate at n = {n}",
                         metric + f"SFA − {f}·full attention", *pair(hd_arms["sfa"][n], hd_arms["full"][n]), n,
                         [ref], hdr.PUBLISHED_SFA, factor=f))
    return out


def gain_rows(hd: HiddenDecodingConfig, files: Mapping[str, Path]) -> list[dict]:
    """The mean solved-score gain over n = 1 by n (n = 1: 0), with SFA and with full attention: the gain-vs-n curve."""
    cells, arms = read_cells(hd, files)
    g = gains(cells, arms, ladder(cells))
    mean = lambda d: statistics.fmean(d) if d else None  # noqa: E731
    return [{"n_streams": n, "gain_tokens": 0.0 if n == 1 else mean(g["sfa"].get(n, [])),
             "gain_full": 0.0 if n == 1 else mean(g["full"].get(n, []))} for n in sorted({1, *g["sfa"], *g["full"]})]


def largest_table(cells_dir: Path) -> str:
    """`largest_markdown` of a study's committed cells (`cells_dir`: its cells/ folder, as a README's generated
    block names it)."""
    folder = Path(cells_dir).parent
    return largest_markdown(config(folder), study_files(folder))


def largest_markdown(hd: HiddenDecodingConfig, files: Mapping[str, Path]) -> str:
    """Per arm: the largest K solved (answer accuracy ≥ SOLVED) in each seed, the solved score (mean over seeds) and
    the answer accuracy at each K (mean, and the lowest seed's)."""
    cells, _ = read_cells(hd, files)
    ks = ladder(cells)
    head = " | ".join(f"K = {K}: acc (lowest)" for K in ks)
    rows = [f"| arm | seeds | largest K solved, per seed | solved score | {head} |", "|---" * (4 + len(ks)) + "|"]
    order = sorted(cells, key=lambda a: (a != "n1", not a.startswith(PAUSE), a))
    for arm in order:
        seeds = seeds_of(cells, arm, ks)
        if not seeds:
            continue
        largest = ", ".join("none" if (k := largest_solved(cells, arm, s, ks)) is None else str(k) for s in seeds)
        solved = statistics.fmean(score(cells, arm, s, ks) for s in seeds)
        acc = " | ".join(f"{statistics.fmean(a := [cells[arm][K][s]['answer_acc'] for s in seeds]):.3f} "
                         f"({min(a):.3f})" for K in ks)
        rows.append(f"| {arm} | {len(seeds)} | {largest} | {solved:.2f} | {acc} |")
    return "\n".join(rows)


def search_table(record: dict) -> str:
    """The positive control's budget search (a study's diagnostics JSON: {"runs": [...]}, each run its arm, K, seed,
    settings, how it ran and its answer accuracy at the end and, where logged, along the way), one row a run."""
    rows = ["| arm | K | seed | d (heads) | lr | warmup | weight decay | steps | ran by | answer acc at the end | "
            "first validation solved (acc ≥ 0.99) |", "|---" * 11 + "|"]
    for r in record["runs"]:
        solved = next((step for step, acc in r.get("answer_acc_curve") or [] if acc >= hdp.SOLVED), None)
        first = "–" if not r.get("answer_acc_curve") else "never" if solved is None else f"step {solved}"
        rows.append(f"| {r['arm']} | {r['K']} | {r['seed']} | {r['d']} ({r['heads']}) | {r['lr']:g} | {r['warmup']:g} "
                    f"| {r['weight_decay']:g} | {r['steps']} | {r['ran_by']} | {r['answer_acc']:.3f} | {first} |")
    return "\n".join(rows)
