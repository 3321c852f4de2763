"""Run-level probe tables: mean and spread over probe seeds and replicate indices (torch-free).

Replicate indices (independently trained models) are the independent units: intervals are Student-t
95% half-widths over indices (``ci95``, NaN with one index; :mod:`epochlens.stats`). Probe seeds
(early-stopping subset and batch order of one probe) are technical repeats: their spread is reported
separately (``*_seed_std``), as the mean over indices of the standard deviation over seeds.
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
PROBE_KEYS = ("run", "epoch", "layer", "representation", "target", "eval_split", "status")


def aggregate_seeds(table: pd.DataFrame, metrics: Sequence[str] = METRIC_COLUMNS) -> pd.DataFrame:
    """Mean, std (ddof 1) and 95% t-interval half-width over seeds of each metric.

    Groups by every column except ``seed``, the metrics and the per-seed counts/epochs; output
    columns: the group columns, n_seeds, and ``{metric}_mean``, ``{metric}_std``, ``{metric}_ci95``.
    With one seed std and ci95 are NaN.
    """
    per_seed = {"seed", "n_fit", "n_stop", "epochs_run", *metrics}
    keys = [c for c in table.columns if c not in per_seed]
    return over_replicates(table, keys, metrics, count="n_seeds")


def probe_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, epoch, layer, representation, target, eval_split, status) from the per-seed
    probe rows of every index (``epochlens.probes.linear.probe_features`` plus run, index and status).

    Columns: the keys, n_features, n_classes, n_indices, n_seeds (probes per index), n_eval and
    chance (means over indices), and per metric of :data:`PROBE_METRICS`: ``_mean`` (over indices
    of the per-index seed means), ``_seed_std`` (probe-seed spread), ``_index_std`` and ``_ci95``
    (over indices). Skipped targets (status other than ``ok``) keep one row with NaN metrics.
    """
    ok = per_seed[per_seed["status"] == "ok"]
    rows = []
    if len(ok):
        seeds = aggregate_seeds(ok, PROBE_METRICS)
        keys = [*PROBE_KEYS, "n_features", "n_classes"]
        per_index = [f"{m}_mean" for m in PROBE_METRICS] + [f"{m}_std" for m in PROBE_METRICS]
        summary = over_replicates(seeds, keys, [*per_index, "n_eval", "chance", "n_seeds"])
        out = summary[[*keys, "n_indices"]].copy()
        out["n_seeds"] = summary["n_seeds_mean"].round().astype(int)
        out["n_eval"] = summary["n_eval_mean"]
        out["chance"] = summary["chance_mean"]
        for m in PROBE_METRICS:
            out[f"{m}_mean"] = summary[f"{m}_mean_mean"]
            out[f"{m}_seed_std"] = summary[f"{m}_std_mean"]
            out[f"{m}_index_std"] = summary[f"{m}_mean_std"]
            out[f"{m}_ci95"] = summary[f"{m}_mean_ci95"]
        rows.append(out)
    skipped = per_seed[per_seed["status"] != "ok"]
    if len(skipped):
        keys = [k for k in PROBE_KEYS if k != "eval_split"]
        rows.append(skipped.groupby(keys, sort=False).size().rename("n_indices").reset_index())
    if not rows:
        return pd.DataFrame(columns=[*PROBE_KEYS, "n_indices"])
    out = pd.concat(rows, ignore_index=True)
    counts = ["n_features", "n_classes", "n_indices", "n_seeds"]
    out[counts] = out.reindex(columns=counts).astype("Int64")  # skipped rows: empty, not 16.0
    return out.sort_values(["epoch", "target"], kind="stable").reset_index(drop=True)
