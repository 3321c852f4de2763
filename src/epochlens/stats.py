"""Run-level tables of probes and ablations: mean and spread over probe seeds and replicate indices.

Replicate indices (independently trained models) are the independent units: intervals are Student-t
95% half-widths over indices (``ci95``, NaN with one index). Probe seeds (early-stopping subset and
batch order of one probe) are technical repeats: their spread is reported separately
(``*_seed_std``), as the mean over indices of the standard deviation over seeds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from epochlens.probes.linear import METRIC_COLUMNS, aggregate_seeds

#: Probe metrics summarised per (epoch, layer, representation, target, eval split): accuracy, loss,
#: fit_accuracy, best_epoch.
PROBE_METRICS = METRIC_COLUMNS
PROBE_KEYS = ("run", "epoch", "layer", "representation", "target", "eval_split", "status")
#: Ablation metrics summarised per (epoch, split, block, group, mode, cohort).
ABLATION_METRICS = ("accuracy_base", "accuracy", "delta_accuracy", "loss_base", "loss", "delta_loss")
ABLATION_KEYS = (
    "run",
    "epoch",
    "split",
    "block",
    "group",
    "channel_start",
    "channel_stop",
    "n_channels",
    "mode",
    "cohort",
)


def over_replicates(
    table: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str], count: str = "n_indices"
) -> pd.DataFrame:
    """Per group of ``keys``: the number of rows (column ``count``), and per metric ``_mean``,
    ``_std`` (ddof 1) and ``_ci95`` (Student-t 95% half-width) over the rows of the group (one row
    per replicate).

    Groups keep their order of first appearance; NaN keys form groups of their own.
    """
    keys = [k for k in keys if k in table.columns]
    grouped = table.groupby(keys, sort=False, dropna=False)
    out = grouped.size().rename(count).reset_index()
    n = out[count].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(n > 1, stats.t.ppf(0.975, np.maximum(n - 1, 1)), np.nan)
    for m in metrics:
        agg = grouped[m].agg(["mean", "std"]).reset_index(drop=True)
        out[f"{m}_mean"] = agg["mean"].to_numpy()
        out[f"{m}_std"] = agg["std"].to_numpy()
        out[f"{m}_ci95"] = t * out[f"{m}_std"].to_numpy() / np.sqrt(n)
    return out


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


def ablation_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, epoch, split, unit group, mode, cohort) from the ablation rows of every
    index (``epochlens.ablation.ablate.ablation_table`` plus run and index): n_indices, n_samples (mean),
    and ``_mean``, ``_std``, ``_ci95`` over indices of each metric of :data:`ABLATION_METRICS`."""
    out = over_replicates(rows, ABLATION_KEYS, [*ABLATION_METRICS, "n_samples"])
    out = out.rename(columns={"n_samples_mean": "n_samples"}).drop(
        columns=["n_samples_std", "n_samples_ci95"]
    )
    return out.sort_values(["epoch"], kind="stable").reset_index(drop=True)
