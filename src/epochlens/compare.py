"""Runs compared across their replicate indices: each run's mean with a Student-t 95% interval, and
the difference of two runs' means with Welch's 95% interval and two-sided p-value (torch-free).

A run's replicate indices (independently trained models) are its samples; two runs are independent
samples of possibly different sizes and spreads, so their difference is Welch's: with means m₁, m₂,
sample variances s₁², s₂² (ddof 1) and counts n₁, n₂,

    d  = m₁ − m₂,   se² = s₁²/n₁ + s₂²/n₂,   t = d / se,
    df = se⁴ / ((s₁²/n₁)² / (n₁ − 1) + (s₂²/n₂)² / (n₂ − 1))       (Welch–Satterthwaite)
    95% CI: d ± t₀.₉₇₅(df) · se,   p = 2 · P(T_df > |t|)

as ``scipy.stats.ttest_ind(a, b, equal_var=False)``. Each run's value per index comes from its
run-level tables at one checkpoint (:func:`checkpoint_values`). Tables are read, never models: this
module knows nothing of the engines that made them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import stdtr, stdtrit

from epochlens.errors import DataError
from epochlens.stats import ci95_halfwidth

#: Columns of the comparison table (one row per comparison, metric, run and the run it is set
#: against: none for the baseline's own row).
TABLE_COLUMNS = (
    "comparison",
    "metric",
    "split",
    "run",
    "epoch",
    "n",
    "mean",
    "std",
    "ci95_low",
    "ci95_high",
    "versus",
    "difference",
    "difference_ci95_low",
    "difference_ci95_high",
    "welch_df",
    "t",
    "p_value",
    "note",
)
#: Columns of the per-index values the comparison table is computed from.
VALUE_COLUMNS = ("comparison", "metric", "split", "run", "index", "epoch", "value")

#: Columns of tables/regression_metrics.csv holding each regression metric.
REGRESSION_COLUMNS = {"mse": "mse", "mae": "mae", "r2": "r2", "loss": "mean_loss"}

NO_SPREAD = "no spread across indices in either run: Welch's interval and p-value are undefined"

#: The values each metric can take: its 95% intervals are cut to them (a Student-t interval of
#: two seeds' accuracies reached 1.075), and the table's note says where one was.
METRIC_RANGES = {
    "accuracy": (0.0, 1.0),
    "loss": (0.0, np.inf),
    "mse": (0.0, np.inf),
    "mae": (0.0, np.inf),
    "r2": (-np.inf, 1.0),
    "mean_curvature": (0.0, np.inf),
}
UNBOUNDED = (-np.inf, np.inf)


def clipped_note(low: float, high: float, bounds: tuple[float, float], what: str) -> str:
    """The note of an interval [low, high] that ``bounds`` cut (empty when they did not)."""
    if low >= bounds[0] and high <= bounds[1]:
        return ""
    return f"{what} 95% interval cut to the metric's range [{bounds[0]:g}, {bounds[1]:g}]"


def run_summary(values: Sequence[float] | np.ndarray, bounds: tuple[float, float] = UNBOUNDED) -> dict:
    """``n``, ``mean``, ``std`` (ddof 1) and the Student-t 95% interval ``ci95_low``, ``ci95_high``
    of one run's values over its indices (two or more, finite), cut to ``bounds`` (the metric's
    range, :data:`METRIC_RANGES`); ``note`` says where it was cut."""
    v = _sample(values)
    mean, std = float(v.mean()), float(np.sqrt(_var(v)))
    half = float(ci95_halfwidth(std, len(v)))
    low, high = mean - half, mean + half
    return {
        "n": len(v), "mean": mean, "std": std,
        "ci95_low": max(low, bounds[0]), "ci95_high": min(high, bounds[1]),
        "note": clipped_note(low, high, bounds, "the run's Student-t"),
    }  # fmt: skip


def welch(
    a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, bounds: tuple[float, float] = UNBOUNDED
) -> dict:
    """The difference of means ``a − b`` with Welch's 95% interval and two-sided p-value; the
    interval cut to the differences that values within ``bounds`` can have.

    Returns:
        ``difference``, ``difference_ci95_low``, ``difference_ci95_high``, ``welch_df``, ``t``,
        ``p_value`` and ``note``: empty, or why the interval and p-value are left empty (no spread
        in either run: every index gave the same value in both).
    """
    a, b = _sample(a), _sample(b)
    d = float(a.mean() - b.mean())
    va, vb = _var(a) / len(a), _var(b) / len(b)
    se2 = va + vb
    out = {"difference": d}
    if se2 == 0:
        empty = dict.fromkeys(["difference_ci95_low", "difference_ci95_high", "welch_df", "t", "p_value"])
        return {**out, **empty, "note": NO_SPREAD}
    se = float(np.sqrt(se2))
    df = float(se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)))
    t = d / se
    half = float(stdtrit(df, 0.975)) * se
    span = bounds[1] - bounds[0]
    return {
        **out,
        "difference_ci95_low": max(d - half, -span),
        "difference_ci95_high": min(d + half, span),
        "welch_df": df,
        "t": t,
        "p_value": float(2 * stdtr(df, -abs(t))),
        "note": clipped_note(d - half, d + half, (-span, span), "the difference's Welch"),
    }


def _var(v: np.ndarray) -> float:
    """Sample variance (ddof 1); exactly 0 for equal values (NumPy's mean of equal values may be
    off by an ulp, and a variance of 1e-35 would make any difference "significant")."""
    return 0.0 if np.ptp(v) == 0 else float(v.var(ddof=1))


def _sample(values: Sequence[float] | np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    if len(v) < 2:
        raise ValueError(f"{len(v)} value(s): a 95% interval over indices needs 2 or more")
    if not np.isfinite(v).all():
        raise ValueError(f"values {v.tolist()} are not all finite")
    return v


def compare_runs(
    values: Mapping[str, pd.Series],
    epochs: Mapping[str, int],
    differences: str = "baseline",
    metric: str | None = None,
) -> pd.DataFrame:
    """One metric of one comparison: each run's summary (:func:`run_summary`) and its differences.

    Args:
        values: per run (the baseline first), its value per replicate index (a Series indexed by
            index).
        epochs: the checkpoint epoch of each run.
        differences: ``baseline``: each other run minus the first; ``all_pairs``: each run minus
            each run before it.
        metric: the metric's name: its intervals are cut to its range (:data:`METRIC_RANGES`).

    Returns:
        One row per run and run it is set against (``versus``; the first run's own row has none),
        the columns of :data:`TABLE_COLUMNS` from ``run`` on.
    """
    bounds = METRIC_RANGES.get(metric, UNBOUNDED)
    if differences not in ("baseline", "all_pairs"):
        raise ValueError(f"differences must be 'baseline' or 'all_pairs', not {differences!r}")
    runs = list(values)
    summaries = {}
    for run in runs:
        try:
            summaries[run] = run_summary(values[run], bounds)
        except ValueError as exc:
            raise DataError(f"run {run}: {exc} (indices {list(values[run].index)})") from None
    rows = [_row(runs[0], epochs[runs[0]], summaries[runs[0]])]
    for k, run in enumerate(runs[1:], start=1):
        for versus in runs[:k] if differences == "all_pairs" else runs[:1]:
            diff = welch(values[run], values[versus], bounds)
            notes = [n for n in (summaries[run]["note"], diff["note"]) if n]
            rows.append(
                {**_row(run, epochs[run], summaries[run]), "versus": versus, **diff, "note": "; ".join(notes)}
            )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS[3:]))


def _row(run: str, epoch: int, summary: dict) -> dict:
    return {"run": run, "epoch": int(epoch), **summary, "versus": ""}


def checkpoint_values(
    table: pd.DataFrame,
    source: str,
    metric: str,
    epoch: int,
    split: str,
    indices: Sequence[int],
    name: str = "table",
) -> pd.Series:
    """A metric of one run at checkpoint ``epoch``, one value per replicate index (a Series indexed
    by index, in the order of ``indices``).

    Args:
        table: the run-level table of ``source``.
        source: ``accuracy`` (tables/accuracy_per_class.csv: accuracy = Σ n_correct / Σ n over the
            evaluated classes, loss = the n-weighted mean of mean_loss), ``regression``
            (tables/regression_metrics.csv, the rows of data_group ``all``) or ``curvature``
            (tables/curvature_per_cohort.csv: the n-weighted mean of curvature_mean over the
            cohorts, i.e. over the training images of the classes active at the checkpoint).
        metric: accuracy or loss (accuracy); mse, mae, r2 or loss (regression); mean_curvature.
        split: ``test`` or ``holdout`` (not used for curvature: the training images).
        indices: the run's replicate indices; each must have its rows.
        name: the table's file, named in errors.

    Raises:
        DataError: a metric the table has no column for, an index without rows at that checkpoint,
            or a value that is not finite.
    """
    rows = table[table["epoch"] == int(epoch)]
    if source == "accuracy":
        rows = rows[rows["split"] == split]
        sums = (
            rows.assign(loss_sum=rows["mean_loss"] * rows["n"])
            .groupby("index")[["n", "n_correct", "loss_sum"]]
            .sum()
        )
        columns = {"accuracy": sums["n_correct"] / sums["n"], "loss": sums["loss_sum"] / sums["n"]}
    elif source == "regression":
        rows = rows[(rows["split"] == split) & (rows["data_group"].astype(str) == "all")]
        if rows.duplicated("index").any():
            raise DataError(
                f"{name}: several rows per index at epoch {epoch}, split {split}, data_group all."
            )
        indexed = rows.set_index("index")
        columns = {m: indexed[c] for m, c in REGRESSION_COLUMNS.items() if c in indexed}
    elif source == "curvature":
        rows = rows[rows["cohort"] >= 0]
        sums = rows.assign(w=rows["curvature_mean"] * rows["n"]).groupby("index")[["n", "w"]].sum()
        columns = {"mean_curvature": sums["w"] / sums["n"]}
    else:
        raise ValueError(f"source must be accuracy, regression or curvature, not {source!r}")
    if metric not in columns:
        raise DataError(f"{name}: no {metric} in a {source} table (it has {sorted(columns)}).")
    by_index = columns[metric]
    missing = [i for i in indices if i not in by_index.index]
    where = f"epoch {epoch}" + ("" if source == "curvature" else f", split {split}")
    if missing:
        raise DataError(
            f"{name}: no rows for indices {missing} at {where}; rerun the rule that writes it "
            "(snakemake deletes and rebuilds it when its inputs change)."
        )
    values = by_index.loc[list(indices)].astype(np.float64)
    bad = values[~np.isfinite(values.to_numpy())]
    if len(bad):
        raise DataError(f"{name}: {metric} is not finite at {where} for indices {list(bad.index)}.")
    return values


def comparison_tables(
    plan: Sequence[Mapping], values: Mapping[tuple[str, str, str], pd.Series]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The comparison table (:data:`TABLE_COLUMNS`) and the per-index values it is computed from
    (:data:`VALUE_COLUMNS`); with no comparisons, both empty with their columns.

    Args:
        plan: the comparisons (:func:`epochlens.config.comparison_plan`): ``name``, ``metrics``,
            ``split``, ``differences`` and ``runs`` (``{run, epoch, ...}``, the baseline first).
        values: the values of each (comparison name, run, metric) (:func:`checkpoint_values`).
    """
    tables, long = [pd.DataFrame(columns=list(TABLE_COLUMNS))], [pd.DataFrame(columns=list(VALUE_COLUMNS))]
    for comparison in plan:
        name = comparison["name"]
        epochs = {r["run"]: r["epoch"] for r in comparison["runs"]}
        for metric in comparison["metrics"]:
            split = "train" if metric == "mean_curvature" else comparison["split"]
            per_run = {run: values[(name, run, metric)] for run in epochs}
            table = compare_runs(per_run, epochs, comparison["differences"], metric)
            tables.append(table.assign(comparison=name, metric=metric, split=split))
            for run, series in per_run.items():
                long.append(
                    pd.DataFrame(
                        {
                            "comparison": name,
                            "metric": metric,
                            "split": split,
                            "run": run,
                            "index": np.asarray(series.index, dtype=np.int64),
                            "epoch": int(epochs[run]),
                            "value": series.to_numpy(),
                        }
                    )
                )
    frames = [f for f in tables if len(f)] or tables[:1]
    table = pd.concat(frames, ignore_index=True)[list(TABLE_COLUMNS)]
    frames = [f for f in long if len(f)] or long[:1]
    return table, pd.concat(frames, ignore_index=True)[list(VALUE_COLUMNS)]


def check_same_samples(name: str, split: str, datasets: Mapping[str, str | Path]) -> str:
    """The runs' ``split`` samples are the same: their data sets' :func:`split_fingerprint` agree;
    returns it.

    Args:
        name: the comparison, named in the error.
        split: ``test`` or ``holdout``.
        datasets: each run's ``dataset.h5``, the baseline first.

    Raises:
        DataError: the runs whose samples differ from the baseline's, and the fix.
    """
    runs = list(datasets)
    prints = {run: split_fingerprint(datasets[run], split) for run in runs}
    differ = [run for run in runs[1:] if prints[run] != prints[runs[0]]]
    if differ:
        raise DataError(
            f"comparison {name}: the {split} samples of runs {differ} differ from those of "
            f"{runs[0]} ({datasets[runs[0]]}); runs are compared on the same {split} data. Compare "
            "runs on the same data (or rerun prepare_data of a run whose source files changed)."
        )
    return prints[runs[0]]


def split_fingerprint(path: str | Path, split: str) -> str:
    """SHA-256 of what a ``dataset.h5`` holds for the ``test`` split (every array of its ``test``
    group: images or tokens, labels or targets, groups, texts) or the ``holdout`` (the rows of the
    ``train`` group under its holdout mask): equal for runs evaluated on the same samples, whatever
    their training splits (a corruption changes those only)."""
    import h5py  # here: only the comparison job reads data sets

    if split not in ("test", "holdout"):
        raise ValueError(f"split must be 'test' or 'holdout', not {split!r}")
    h = hashlib.sha256()
    try:
        with h5py.File(path, "r") as f:
            group = f["test" if split == "test" else "train"]
            rows = None if split == "test" else np.flatnonzero(group["holdout"][()])
            for key in sorted(group):
                data = group[key]
                if not isinstance(data, h5py.Dataset) or (rows is not None and key == "holdout"):
                    continue
                a = data[()] if rows is None or data.shape[:1] != group["holdout"].shape else data[()][rows]
                h.update(f"{key}{a.dtype.str if a.dtype.kind != 'O' else 'O'}{a.shape}".encode())
                h.update(_bytes(a))
    except (OSError, KeyError) as exc:
        raise DataError(
            f"{path}: not a complete epochlens dataset.h5 ({exc}). Delete it and rerun the prepare_data rule."
        ) from exc
    return h.hexdigest()


def _bytes(a: np.ndarray) -> bytes:
    if a.dtype.kind != "O":  # strings (a text run's texts) are objects: hash their contents
        return np.ascontiguousarray(a).tobytes()
    return b"\0".join(x if isinstance(x, bytes) else str(x).encode() for x in a.ravel())
