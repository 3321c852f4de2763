"""Run-level probe tables: mean and spread over probe seeds and replicate indices (torch-free).

Replicate indices (independently trained models) are the independent units: intervals are Student-t
95% half-widths over indices (``ci95``, NaN with one index; :mod:`epochlens.stats`). Probe seeds
(early-stopping subset and batch order of one probe) are technical repeats: their spread is reported
separately (``*_seed_std``), as the mean over indices of the standard deviation over seeds.

Rows carry their score's name in ``metric``: ``accuracy`` (softmax probes: :data:`PROBE_METRICS`)
or ``r2`` (a regression's ridge probe: :data:`RIDGE_METRICS`, the score in ``r2_*``, never in
``accuracy_*``). A table without a ``metric`` column (written before there was one) holds
accuracies.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from epochlens.stats import over_replicates

ID_COLUMNS = ("layer", "representation", "target", "eval_split")
METRIC_COLUMNS = ("accuracy", "loss", "fit_accuracy", "best_epoch")
#: Probe metrics summarised per (epoch, layer, representation, target, eval split): accuracy, loss,
#: fit_accuracy, best_epoch.
PROBE_METRICS = METRIC_COLUMNS
#: A ridge probe's (``metric`` r2): R², mean squared error, R² on its fit samples, penalty kept.
RIDGE_METRICS = ("r2", "loss", "fit_r2", "alpha")
#: Metrics of each kind of row (``metric`` column) and the count column of its outputs.
METRICS_BY_KIND = {"accuracy": (PROBE_METRICS, "n_classes"), "r2": (RIDGE_METRICS, "n_outputs")}
PROBE_KEYS = ("run", "epoch", "layer", "representation", "target", "eval_split", "status")
_PER_SEED = {"seed", "n_fit", "n_stop", "epochs_run"}


def aggregate_seeds(table: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean, std (ddof 1) and 95% t-interval half-width over seeds of each metric.

    Groups by every column except ``seed``, the metrics and the per-seed counts/epochs; output
    columns: the group columns, n_seeds, and ``{metric}_mean``, ``{metric}_std``, ``{metric}_ci95``.
    With one seed std and ci95 are NaN. ``metrics`` None: those of each row's ``metric``
    (:data:`METRICS_BY_KIND`; rows of another kind leave the columns of this one empty).
    """
    if metrics is not None:
        per_seed = _PER_SEED | set(metrics)
        keys = [c for c in table.columns if c not in per_seed]
        return over_replicates(table, keys, metrics, count="n_seeds")
    parts = [aggregate_seeds(rows, metrics) for rows, metrics in _by_kind(table)]
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def _by_kind(table: pd.DataFrame) -> list[tuple[pd.DataFrame, tuple[str, ...]]]:
    """``(rows, metrics)`` per kind of row (``metric``), without the other kinds' columns."""
    if "metric" not in table.columns:
        return [(table, PROBE_METRICS)]
    out = []
    for kind, rows in table.groupby("metric", sort=False):
        if kind not in METRICS_BY_KIND:
            raise ValueError(f"probe rows of metric {kind!r}; known: {list(METRICS_BY_KIND)}")
        metrics, count = METRICS_BY_KIND[kind]
        other = {c for k, (m, n) in METRICS_BY_KIND.items() if k != kind for c in (*m, n)}
        drop = [c for c in rows.columns if c in other - {*metrics, count} or c == "epochs_run"]
        out.append((rows.drop(columns=drop), metrics))
    return out


def probe_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, epoch, layer, representation, target, eval_split, status) from the per-seed
    probe rows of every index (``epochlens.probes.linear.probe_features`` plus run, index and status).

    Columns: the keys, n_features, n_classes, n_indices, n_seeds (probes per index), n_eval and
    chance (means over indices), and per metric of :data:`PROBE_METRICS`: ``_mean`` (over indices
    of the per-index seed means), ``_seed_std`` (probe-seed spread), ``_index_std`` and ``_ci95``
    (over indices). Skipped targets (status other than ``ok``) keep one row with NaN metrics.
    """
    if "metric" not in per_seed.columns:  # a table from before the metric column: accuracies
        per_seed = per_seed.assign(metric="accuracy")
    ok = per_seed[per_seed["status"] == "ok"]
    rows = []
    for kind_rows, metrics in _by_kind(ok) if len(ok) else []:
        count = METRICS_BY_KIND[kind_rows["metric"].iloc[0]][1]
        seeds = aggregate_seeds(kind_rows, metrics)
        keys = [*PROBE_KEYS, "n_features", count, "metric"]
        per_index = [f"{m}_mean" for m in metrics] + [f"{m}_std" for m in metrics]
        summary = over_replicates(seeds, keys, [*per_index, "n_eval", "chance", "n_seeds"])
        out = summary[[*keys, "n_indices"]].copy()
        out["n_seeds"] = summary["n_seeds_mean"].round().astype(int)
        out["n_eval"] = summary["n_eval_mean"]
        out["chance"] = summary["chance_mean"]
        for m in metrics:
            out[f"{m}_mean"] = summary[f"{m}_mean_mean"]
            out[f"{m}_seed_std"] = summary[f"{m}_std_mean"]
            out[f"{m}_index_std"] = summary[f"{m}_mean_std"]
            out[f"{m}_ci95"] = summary[f"{m}_mean_ci95"]
        rows.append(out)
    skipped = per_seed[per_seed["status"] != "ok"]
    if len(skipped):
        keys = [k for k in PROBE_KEYS if k != "eval_split"] + ["metric"]
        rows.append(skipped.groupby(keys, sort=False).size().rename("n_indices").reset_index())
    if not rows:
        return pd.DataFrame(columns=[*PROBE_KEYS, "n_indices", "metric"])
    out = pd.concat(rows, ignore_index=True)
    out = out.reindex(columns=summary_columns(out))
    counts = [c for c in ("n_features", "n_classes", "n_indices", "n_seeds", "n_outputs") if c in out]
    out[counts] = out[counts].astype("Int64")  # skipped rows: empty, not 16.0
    return out.sort_values(["epoch", "target"], kind="stable").reset_index(drop=True)


def summary_columns(table: pd.DataFrame) -> list[str]:
    """Column order of the run's probe table: a classifier's as before ``metric`` existed, then
    ``metric``, then what a ridge probe adds (n_outputs, r2_*, fit_r2_*, alpha_*) where it ran."""
    spreads = ("mean", "seed_std", "index_std", "ci95")
    first = [*PROBE_KEYS, "n_features", "n_classes", "n_indices", "n_seeds", "n_eval", "chance"]
    first += [f"{m}_{s}" for m in PROBE_METRICS for s in spreads]
    ridge = ["n_outputs"] + [f"{m}_{s}" for m in RIDGE_METRICS if m != "loss" for s in spreads]
    has_ridge = "r2_mean" in table.columns or ("metric" in table and (table["metric"] == "r2").any())
    return first + ["metric"] + (ridge if has_ridge else [])
