"""The linear datamodeling score (LDS): how well influence scores predict what retraining does
(torch-free: the tables job uses it; the retraining is :mod:`epochlens.study.retrain`, or the
user's training command: :mod:`epochlens.study.retrain_command`).

LDS (Park et al., "TRAK", 2023; the yardstick of dattri's benchmarks, EleutherAI's bergson and the
kronfluence paper): draw M random subsets S_1..S_M of the training images, each a ``fraction`` of
them; retrain the model on each with the run's own recipe (or its own training command, given
the subset); measure every query's loss L_q(θ_{S_m}). Influence predicts those losses to first
order. With this package's scores
s_qn = g_qᵀ P g_n (P ≈ H⁻¹; positive: upweighting image n lowers query q's loss), training on S_m
rather than on every image is the removal of the others, and the loss is predicted as

    L_q(θ_{S_m}) ≈ c_q − Σ_{n ∈ S_m} s_qn        (c_q the same for every subset).

A query's LDS is the Spearman correlation, over the M subsets, of that prediction with the
measured loss (only ranks matter, so c_q, P's scale and the first-order factor do not); a
method's LDS is the mean over the queries (queries whose measured loss does not vary are left
out). 1: the scores order the subsets exactly as retraining does; 0: no better than chance (the
``random`` reference row: Gaussian scores). Its 95% interval is a percentile bootstrap over the
subsets with the queries held fixed: it says how much the number would move with other
retrainings of the same size.

Retraining is noisy (SGD, early stopping), so even exact scores stay below 1; what the table
compares is the methods on the same retrainings.

What is measured after each retraining (:class:`Retrainings`): a classifier's log-probabilities of
every test sample over the active classes (a query's loss: −log p of its label), or the per-sample
loss of every test sample under its own target (``test_losses``; a query's loss: that of its test
sample): a regression's squared error, a text-to-text model's mean NLL of the target tokens (the
loss its influence task scores). All are losses, lower when the training helped the query, so the
sign convention above holds for each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from epochlens.errors import ConfigError, InfluenceError

LDS_STARTS = ("scratch", "previous")
LDS_COLUMNS = (
    "method", "epoch", "index", "lds", "ci_low", "ci_high", "n_queries", "n_subsets", "fraction",
)  # fmt: skip


@dataclass
class LdsSettings:
    """``influence.lds``: the retrainings that LDS is measured on."""

    enabled: bool = field(default=False, metadata={"help": "measure LDS for this run's influence"})
    subsets: int = field(default=16, metadata={"help": "random subsets of the training images (M)"})
    fraction: float = field(default=0.5, metadata={"help": "share of the training images in each subset"})
    seed: int = field(default=0, metadata={"help": "seed of the subsets"})
    start: str = field(
        default="scratch",
        metadata={
            "help": "retrain from scratch (scratch), or from the run's checkpoint before the analysed "
            "one, training only the epochs in between (previous)"
        },
    )
    parts: int = field(
        default=1,
        metadata={"help": "jobs per (index, epoch): the subsets are split over them", "execution": True},
    )
    bootstrap: int = field(
        default=1000, metadata={"help": "bootstrap resamples of the subsets for the 95% CI", "tables": True}
    )

    def __post_init__(self) -> None:
        problems = []
        if self.subsets < 3:
            problems.append(f"subsets={self.subsets} must be >= 3 (a rank correlation over subsets)")
        if not 0 < self.fraction < 1:
            problems.append(f"fraction={self.fraction} must be in (0, 1)")
        if not 1 <= self.parts <= self.subsets:
            problems.append(f"parts={self.parts} must be in 1..subsets")
        if self.bootstrap < 0:
            problems.append(f"bootstrap={self.bootstrap} must be >= 0")
        if self.start not in LDS_STARTS:
            problems.append(f"start={self.start!r} must be one of {list(LDS_STARTS)}")
        if problems:
            raise ConfigError("influence.lds: " + "; ".join(problems) + ". Fix the config.")


def predicted_losses(pairwise: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """(M, Q): −Σ_{n ∈ S_m} s_qn for scores (Q, N) (NaN, i.e. not scored, counts as 0)."""
    scores = np.nan_to_num(np.asarray(pairwise, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return -(np.asarray(masks, np.float64) @ scores.T)


def column_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each column of ``a`` with the same column of ``b`` (M, Q) -> (Q,),
    ties at their mean rank (as scipy.stats.spearmanr); NaN where a column does not vary."""
    ra = pd.DataFrame(a).rank(axis=0).to_numpy(dtype=np.float64, copy=True)
    rb = pd.DataFrame(b).rank(axis=0).to_numpy(dtype=np.float64, copy=True)
    ra -= ra.mean(axis=0)
    rb -= rb.mean(axis=0)
    denom = np.sqrt((ra**2).sum(axis=0) * (rb**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (ra * rb).sum(axis=0) / np.where(denom > 0, denom, 1.0), np.nan)


@dataclass
class LdsResult:
    """LDS of one method at one checkpoint: ``lds`` (mean over queries), its bootstrap interval,
    the per-query correlations (Q,) and how many queries counted."""

    lds: float
    ci_low: float
    ci_high: float
    per_query: np.ndarray
    n_queries: int


def linear_datamodeling_score(
    pairwise: np.ndarray, masks: np.ndarray, losses: np.ndarray, bootstrap: int = 1000, seed: int = 0
) -> LdsResult:
    """LDS of scores ``pairwise`` (Q, N) against the losses (M, Q) measured after retraining on
    the subsets ``masks`` (M, N); see the module docstring."""
    losses = np.asarray(losses, np.float64)
    masks = np.asarray(masks, dtype=bool)
    if masks.shape[0] != losses.shape[0] or pairwise.shape[0] != losses.shape[1]:
        raise ValueError(
            f"shapes do not fit: scores {pairwise.shape}, subsets {masks.shape}, losses {losses.shape}"
        )
    predicted = predicted_losses(pairwise, masks)
    per_query = column_spearman(predicted, losses)
    counted = np.isfinite(per_query)
    lds = float(per_query[counted].mean()) if counted.any() else float("nan")
    low = high = float("nan")
    if bootstrap and counted.any():
        rng = np.random.default_rng(seed)
        m = len(losses)
        draws = np.empty(bootstrap)
        for b in range(bootstrap):
            pick = rng.integers(0, m, m)
            draws[b] = np.nanmean(column_spearman(predicted[pick][:, counted], losses[pick][:, counted]))
        low, high = (float(v) for v in np.nanpercentile(draws, [2.5, 97.5]))
    return LdsResult(lds, low, high, per_query, int(counted.sum()))


def query_losses(
    log_probs: np.ndarray, active_classes: np.ndarray, test_indices: np.ndarray, labels: np.ndarray
) -> np.ndarray:
    """(M, Q) losses −log p(label | query) of the retrained models, from their log-probabilities
    (M, N_test, A) over the ``active_classes`` (A,) of every test image."""
    active = np.asarray(active_classes, np.int64)
    position = {int(c): p for p, c in enumerate(active)}
    missing = sorted({int(y) for y in labels} - set(position))
    if missing:
        raise ValueError(f"query labels {missing} are not among the retrained models' active classes")
    cols = np.array([position[int(y)] for y in labels], dtype=np.int64)
    return -np.asarray(log_probs, np.float64)[:, np.asarray(test_indices, np.int64), cols]


def regression_query_losses(test_losses: np.ndarray, test_indices: np.ndarray) -> np.ndarray:
    """(M, Q) losses of a regression's (or a text-to-text model's) queries after each retraining:
    the per-sample losses (M, N_test) of their test samples (each query is a test sample under its
    own target)."""
    return np.asarray(test_losses, np.float64)[:, np.asarray(test_indices, np.int64)]


@dataclass
class Retrainings:
    """One checkpoint's retrainings (its ``lds_retrain`` parts, in subset order): the subsets
    ``masks`` (M, N) bool and what was measured after each: a classifier's test ``log_probs``
    (M, N_test, A) over its ``active_classes`` (A,), or a regression's or a text-to-text model's
    ``test_losses`` (M, N_test), each test sample's loss under its own target."""

    masks: np.ndarray
    log_probs: np.ndarray | None = None
    active_classes: np.ndarray | None = None
    test_losses: np.ndarray | None = None

    def query_losses(self, test_indices: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(M, Q) losses of the queries (test samples ``test_indices`` under ``labels``)."""
        if self.test_losses is not None:
            return regression_query_losses(self.test_losses, test_indices)
        return query_losses(self.log_probs, self.active_classes, test_indices, labels)


def lds_rows(
    scores: dict[str, dict[str, np.ndarray]],
    masks: np.ndarray,
    log_probs: np.ndarray,
    active_classes: np.ndarray,
    index: int,
    epoch: int,
    fraction: float,
    bootstrap: int,
    seed: int,
) -> tuple[list[dict], list[pd.DataFrame]]:
    """Rows of ``lds.csv`` for one (index, epoch) of a classifier (:func:`retraining_rows` of its
    retrained log-probabilities)."""
    retrainings = Retrainings(masks, log_probs=log_probs, active_classes=active_classes)
    return retraining_rows(scores, retrainings, index, epoch, fraction, bootstrap, seed)


def retraining_rows(
    scores: dict[str, dict[str, np.ndarray]],
    retrainings: Retrainings,
    index: int,
    epoch: int,
    fraction: float,
    bootstrap: int,
    seed: int,
) -> tuple[list[dict], list[pd.DataFrame]]:
    """Rows of ``lds.csv`` for one (index, epoch): one per method of ``scores`` (each the contents
    of its ``scores.npz``: ``pairwise_none``, ``query_test_indices``, ``query_labels``) plus the
    ``random`` reference; and the per-query correlations (``lds_queries.csv``)."""
    rows, per_query = [], []
    reference = None
    masks = retrainings.masks
    for method, arrays in scores.items():
        losses = retrainings.query_losses(arrays["query_test_indices"], arrays["query_labels"])
        pairwise = arrays["pairwise_none"]
        result = linear_datamodeling_score(pairwise, masks, losses, bootstrap, seed)
        rows.append(_row(method, epoch, index, result, len(masks), fraction))
        per_query.append(_queries(method, epoch, index, arrays["query_test_indices"], result))
        if reference is None:
            rng = np.random.default_rng([seed, index, epoch])
            random = rng.standard_normal(pairwise.shape)
            reference = linear_datamodeling_score(random, masks, losses, bootstrap, seed)
            reference_queries = arrays["query_test_indices"]
    if reference is not None:
        rows.append(_row("random", epoch, index, reference, len(masks), fraction))
        per_query.append(_queries("random", epoch, index, reference_queries, reference))
    return rows, per_query


def _row(method: str, epoch: int, index: int, r: LdsResult, m: int, fraction: float) -> dict:
    return dict(
        method=method, epoch=epoch, index=index, lds=r.lds, ci_low=r.ci_low, ci_high=r.ci_high,
        n_queries=r.n_queries, n_subsets=m, fraction=fraction,
    )  # fmt: skip


def _queries(method: str, epoch: int, index: int, test_indices: np.ndarray, r: LdsResult) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "method": method,
            "epoch": epoch,
            "index": index,
            "test_index": np.asarray(test_indices, np.int64),
            "spearman": r.per_query,
        }
    )


def read_parts(paths: list[str]) -> Retrainings:
    """One checkpoint's retraining parts (``lds_retrain`` outputs), in subset order: a
    classifier's (``log_probs``, ``active_classes``) or a regression's or text-to-text model's
    (``test_losses``)."""
    ids, masks, measured, active, kind = [], [], [], None, None
    for path in paths:
        with np.load(path) as part:
            this = "test_losses" if "test_losses" in part else "log_probs"
            if kind is not None and this != kind:
                raise ValueError(
                    f"{path} holds {this}, the other parts of its checkpoint {kind}: parts of another run "
                    "kind; delete the checkpoint's lds/retrain_*.npz and run snakemake again."
                )
            kind = this
            ids.append(part["subset_ids"])
            masks.append(part["masks"])
            measured.append(part[kind])
            if kind == "log_probs":
                if active is not None and not np.array_equal(active, part["active_classes"]):
                    raise ValueError(f"{path}: active classes differ from the other parts'")
                active = part["active_classes"]
    order = np.argsort(np.concatenate(ids), kind="stable")
    masks_, values = np.concatenate(masks)[order], np.concatenate(measured)[order]
    if kind == "test_losses":
        return Retrainings(masks_, test_losses=values)
    return Retrainings(masks_, log_probs=values, active_classes=active)


def lds_tables(
    jobs: list[dict],
    score_paths: list[str],
    parts: dict[tuple[int, int], list[str]],
    fraction: float,
    bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """``lds`` (one row per (index, epoch, method) and the ``random`` reference) and
    ``lds_queries`` (each query's correlation) of a run.

    Args:
        jobs: ``{index, epoch, method}`` of each influence job, in the order of ``score_paths``.
        score_paths: their ``scores.npz``.
        parts: per (index, epoch), the ``lds_retrain`` outputs.
        fraction, bootstrap, seed: ``influence.lds``'s.
    """
    by_checkpoint: dict[tuple[int, int], dict[str, dict[str, np.ndarray]]] = {}
    for job, path in zip(jobs, score_paths, strict=True):
        with np.load(path) as npz:
            if "pairwise_none" not in npz:  # a store's summary (influence.projection.pairwise_gb)
                raise InfluenceError(
                    f"{path} has no scores of untransformed queries (pairwise_none): the LDS needs "
                    "them whole; raise influence.projection.pairwise_gb above their size, or run "
                    f"the LDS without {job['method']} (influence.methods: the LDS scores each)."
                )
            arrays = {k: npz[k] for k in ("pairwise_none", "query_test_indices", "query_labels")}
        by_checkpoint.setdefault((int(job["index"]), int(job["epoch"])), {})[job["method"]] = arrays
    rows, queries = [], []
    for (index, epoch), scores in by_checkpoint.items():
        retrainings = read_parts(parts[(index, epoch)])
        r, q = retraining_rows(scores, retrainings, index, epoch, fraction, bootstrap, seed)
        rows += r
        queries += q
    return {
        "lds": pd.DataFrame(rows, columns=list(LDS_COLUMNS)),
        "queries": pd.concat(queries, ignore_index=True) if queries else pd.DataFrame(),
    }
