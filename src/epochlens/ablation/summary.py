"""Run-level ablation tables: mean and spread over replicate indices (torch-free)."""

from __future__ import annotations

import pandas as pd

from epochlens.stats import over_replicates

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


def ablation_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, epoch, split, unit group, mode, cohort) from the ablation rows of every
    index (``epochlens.ablation.ablate.ablation_table`` plus run and index): n_indices, n_samples (mean),
    and ``_mean``, ``_std``, ``_ci95`` over indices of each metric of :data:`ABLATION_METRICS` that
    the rows have (a regression's: the loss ones)."""
    metrics = [m for m in ABLATION_METRICS if m in rows]  # a regression's rows have no accuracy
    out = over_replicates(rows, ABLATION_KEYS, [*metrics, "n_samples"])
    out = out.rename(columns={"n_samples_mean": "n_samples"}).drop(
        columns=["n_samples_std", "n_samples_ci95"]
    )
    return out.sort_values(["epoch"], kind="stable").reset_index(drop=True)
