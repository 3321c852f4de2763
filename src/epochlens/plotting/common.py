"""Figures drawn from the tidy tables (never from raw results), as PNG and PDF."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from epochlens.atomic import atomic_path  # noqa: E402
from epochlens.stats import mean_ci  # noqa: E402

#: Fewest replicate seeds for which figures draw a 95% confidence band (see _line).
MIN_SEEDS_FOR_CI = 3


def save_figure(fig: plt.Figure, paths: list[str | Path]) -> None:
    """Save ``fig`` to each path (format from the suffix), atomically, then close it."""
    for path in paths:
        path = Path(path)
        with atomic_path(path) as tmp:
            fmt = path.suffix.lstrip(".")
            # No creation date in PDFs: the same results give byte-identical figures.
            metadata = {"CreationDate": None} if fmt == "pdf" else None
            fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight", metadata=metadata)
    plt.close(fig)


def plot_accuracy_by_cohort(
    cohorts: pd.DataFrame, epochs_per_task: int, title: str, split: str = "test"
) -> plt.Figure:
    """Two panels: accuracy of each task cohort over checkpoints, and old vs new classes.

    ``cohorts`` is the output of :func:`epochlens.evaluation.cohort_table`; with several replicate
    indices the line is their mean and the band a 95% interval.
    """
    df = cohorts[cohorts["split"] == split]
    fig, (ax_cohort, ax_age) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    cohort_ids = sorted(c for c in df["cohort"].unique() if c >= 0)
    cmap = plt.get_cmap("viridis", max(len(cohort_ids), 2))
    for k, cohort in enumerate(cohort_ids):
        sub = df[df["cohort"] == cohort]
        _line(ax_cohort, sub, color=cmap(k), label=f"task {cohort}")
    ax_cohort.set_title("accuracy of each task's classes")
    ax_cohort.legend(fontsize=7, ncol=2 if len(cohort_ids) > 6 else 1, title="introduced in")
    for group, color in (("new", "tab:orange"), ("old", "tab:blue")):
        _line(ax_age, df[df["group"] == group], color=color, label=f"{group} classes")
    ax_age.set_title("newest task vs earlier tasks")
    ax_age.legend(fontsize=8)
    for ax in (ax_cohort, ax_age):
        ax.set_xlabel("checkpoint epoch")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        for boundary in range(0, int(df["epoch"].max()) + 1, epochs_per_task):
            ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)
    ax_cohort.set_ylabel(f"{split} accuracy")
    fig.suptitle(f"{title}: class-incremental accuracy{_replicates_note(df['index'].nunique())}")
    fig.tight_layout()
    return fig


def _line(ax: plt.Axes, sub: pd.DataFrame, color, label: str, column: str = "accuracy") -> None:
    """Mean of ``column`` over replicate indices per epoch, with a 95% band from 3 seeds on.

    With 2 seeds a t-interval (t = 12.7) says little and mostly hides the lines: each seed is drawn
    as a thin line instead.
    """
    if sub.empty:
        return
    by_epoch = sub.groupby("epoch")[column].apply(mean_ci)
    epochs = by_epoch.index.to_numpy()
    mean = np.array([m for m, _ in by_epoch])
    half = np.array([h for _, h in by_epoch])
    ax.plot(epochs, mean, marker="o", ms=3, color=color, label=label)
    if sub["index"].nunique() >= MIN_SEEDS_FOR_CI:
        ax.fill_between(epochs, mean - half, mean + half, color=color, alpha=0.2)
    elif sub["index"].nunique() > 1:
        for _, seed in sub.groupby("index"):
            ax.plot(seed["epoch"], seed[column], color=color, lw=0.6, alpha=0.4)


def _replicates_note(n_idx: int) -> str:
    """Title suffix saying what the lines show (see _line)."""
    if n_idx >= MIN_SEEDS_FOR_CI:
        return f" (mean and 95% CI over {n_idx} seeds)"
    if n_idx > 1:
        return f" (mean of {n_idx} seeds; thin lines: each seed)"
    return ""


def plot_training_curves(logs: pd.DataFrame, epochs_per_task: int, title: str) -> plt.Figure:
    """Training loss and holdout accuracy per epoch, one line per replicate index.

    ``logs`` concatenates the per-index training logs with an ``index`` column. Task boundaries are
    marked: the loss jumps and holdout accuracy drops when a task's new classes arrive.
    """
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    cmap = plt.get_cmap("tab10")
    for k, (index, log) in enumerate(logs.groupby("index")):
        ax_loss.plot(log["epoch"], log["train_loss"], color=cmap(k % 10), label=f"index {index}")
        ax_acc.plot(log["epoch"], log["holdout_accuracy"], color=cmap(k % 10), label=f"index {index}")
    for ax in (ax_loss, ax_acc):
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        for boundary in range(0, int(logs["epoch"].max()) + 1, epochs_per_task):
            ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)
        ax.legend(fontsize=8)
    ax_loss.set_ylabel("training loss (active classes)")
    ax_loss.set_yscale("log")
    ax_acc.set_ylabel("holdout accuracy (active classes)")
    ax_acc.set_ylim(-0.02, 1.02)
    fig.suptitle(f"{title}: class-incremental training")
    fig.tight_layout()
    return fig


def _task_boundaries(ax: plt.Axes, last_epoch: int, epochs_per_task: int) -> None:
    for boundary in range(0, int(last_epoch) + 1, epochs_per_task):
        ax.axvline(boundary, color="0.85", lw=0.8, zorder=0)


def _cohort_colors(cohorts) -> dict[int, tuple]:
    cohorts = sorted(int(c) for c in cohorts)
    cmap = plt.get_cmap("viridis", max(len(cohorts), 2))
    return {c: cmap(k) for k, c in enumerate(cohorts)}


def plot_curvature_by_cohort(cohorts: pd.DataFrame, epochs_per_task: int, title: str) -> plt.Figure:
    """Mean curvature of each task cohort over checkpoints, and of old vs new classes.

    ``cohorts`` is :func:`epochlens.curvature.dynamics.cohort_curvature` per index with an ``index``
    column; lines are means over indices with a Student-t 95% band.
    """
    fig, (ax_cohort, ax_age) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    by_cohort = cohorts[cohorts["cohort"] >= 0]
    colors = _cohort_colors(by_cohort["cohort"].unique())
    for cohort, color in colors.items():
        sub = by_cohort[by_cohort["cohort"] == cohort]
        _line(ax_cohort, sub, color, f"task {cohort}", column="curvature_mean")
    ax_cohort.set_title("each task's training images")
    ax_cohort.legend(fontsize=7, ncol=2 if len(colors) > 6 else 1, title="introduced in")
    for group, color in (("new", "tab:orange"), ("old", "tab:blue")):
        _line(ax_age, cohorts[cohorts["group"] == group], color, f"{group} classes", "curvature_mean")
    ax_age.set_title("newest task vs earlier tasks")
    ax_age.legend(fontsize=8)
    for ax in (ax_cohort, ax_age):
        ax.set_xlabel("checkpoint epoch")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        _task_boundaries(ax, cohorts["epoch"].max(), epochs_per_task)
    ax_cohort.set_ylabel("mean input-loss curvature")
    note = _replicates_note(cohorts["index"].nunique())
    fig.suptitle(f"{title}: per-image curvature by task cohort{note}")
    fig.tight_layout()
    return fig


def plot_curvature_distribution(pooled: pd.DataFrame, title: str, max_panels: int = 6) -> plt.Figure:
    """Box plots of per-image curvature by task cohort at up to ``max_panels`` checkpoints.

    ``pooled`` is :func:`epochlens.curvature.dynamics.cohort_curvature` over the samples of every
    index together: boxes span the quartiles, whiskers the 5% and 95% quantiles, a line the median.
    The epochs shown are spread evenly over the analysed ones, always with the first and last.
    """
    by_cohort = pooled[pooled["cohort"] >= 0]
    epochs = sorted(by_cohort["epoch"].unique())
    picks = sorted({epochs[round(k)] for k in np.linspace(0, len(epochs) - 1, min(max_panels, len(epochs)))})
    colors = _cohort_colors(by_cohort["cohort"].unique())
    ncols = min(3, len(picks))
    nrows = -(-len(picks) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), sharey=True, squeeze=False)
    for ax, epoch in zip(axes.flat, picks, strict=False):
        sub = by_cohort[by_cohort["epoch"] == epoch].sort_values("cohort")
        boxes = [
            {
                "med": r.curvature_q50,
                "q1": r.curvature_q25,
                "q3": r.curvature_q75,
                "whislo": r.curvature_q05,
                "whishi": r.curvature_q95,
                "mean": r.curvature_mean,
                "label": str(r.cohort),
                "fliers": [],
            }
            for r in sub.itertuples()
        ]
        art = ax.bxp(boxes, showmeans=True, showfliers=False, patch_artist=True, widths=0.6)
        for patch, cohort in zip(art["boxes"], sub["cohort"], strict=True):
            patch.set_facecolor(colors[int(cohort)])
            patch.set_alpha(0.6)
        ax.set_title(f"epoch {epoch} (n={int(sub['n'].sum())})", fontsize=9)
        ax.set_xlabel("task cohort")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
        if len(boxes) > 10:  # many cohorts (e.g. 20 CIFAR-100 tasks): label every other one
            for k, label in enumerate(ax.get_xticklabels()):
                label.set_visible(k % 2 == 0)
    for ax in axes.flat[len(picks) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("per-image curvature")
    fig.suptitle(f"{title}: curvature distribution by cohort (box 25-75%, whiskers 5-95%, ▲ mean)")
    fig.tight_layout()
    return fig


def plot_curvature_vs_loss(samples: pd.DataFrame, title: str) -> plt.Figure:
    """Per-image curvature against loss (last analysed epoch), CSL and learning time.

    ``samples`` is :func:`epochlens.curvature.dynamics.sample_dynamics` of every index, concatenated.
    Log-log scatter coloured by task cohort, Spearman's rho over all points in each title.
    """
    seen = samples[samples["n_epochs"] > 0]
    colors = _cohort_colors(seen["task"].unique())
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    panels = (
        ("loss_final", "curvature_final", "loss at the last analysed epoch", "curvature (last epoch)"),
        ("csl_mean", "curvature_mean", "CSL per analysed epoch (csl_mean)", "mean curvature over epochs"),
        ("epochs_to_learn", "curvature_mean", "epochs to learn (learning time - start of its task)", ""),
    )
    for ax, (x, y, xlabel, ylabel) in zip(axes, panels, strict=True):
        log_x = x != "epochs_to_learn"  # learning time: linear, 0 included
        ok = seen[((seen[x] > 0) if log_x else seen[x].notna()) & (seen[y] > 0)]
        ax.scatter(
            ok[x], ok[y], c=[colors[int(t)] for t in ok["task"]], s=4, alpha=0.5, lw=0, rasterized=True
        )
        rho = stats.spearmanr(ok[x], ok[y]).statistic if len(ok) > 2 else float("nan")
        ax.set_title(f"Spearman rho = {rho:.2f} (n={len(ok)})", fontsize=9)
        ax.set_xscale("log" if log_x else "linear")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel or axes[1].get_ylabel())
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=f"task {t}") for t, c in colors.items()]
    axes[-1].legend(handles=handles, fontsize=7, ncol=2 if len(handles) > 6 else 1, title="cohort")
    n_idx = samples["index"].nunique() if "index" in samples else 1
    fig.suptitle(
        f"{title}: curvature vs loss, cumulative sample loss and learning time ({n_idx} seeds pooled; "
        "samples never learned are left out of the right panel)"
    )
    fig.tight_layout()
    return fig


def _heatmap_panel(
    ax: plt.Axes,
    matrix: np.ndarray,
    rows: list[str],
    epochs: list[int],
    cmap,
    norm,
    fmt: str,
    annotate: bool,
    row_labels: bool = True,
) -> plt.cm.ScalarMappable:
    """``matrix`` (rows x epochs) as coloured cells, NaN in light grey, values written if asked."""
    cmap = plt.get_cmap(cmap).copy()
    cmap.set_bad("0.9")
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    ax.set_xticks(range(len(epochs)), [str(e) for e in epochs], rotation=90 if len(epochs) > 12 else 0)
    ax.set_yticks(range(len(rows)), rows if row_labels else [])
    ax.tick_params(labelsize=7, length=0)
    if annotate:
        for (i, j), value in np.ndenumerate(matrix):
            if np.isfinite(value):
                r, g, b, _ = cmap(norm(value))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(
                    j, i, fmt.format(value), ha="center", va="center", fontsize=6, color="w" if dark else "k"
                )
    return image


def _target_label(target: str) -> str:
    if target == "class":
        return "class (among the active classes)"
    if target == "cohort":
        return "old vs new classes"
    if target.startswith("curvature_q"):
        return f"curvature quantile bin ({target.removeprefix('curvature_q')} bins)"
    return target


def plot_probe_accuracy(summary: pd.DataFrame, title: str, split: str = "holdout") -> plt.Figure:
    """Heatmaps of linear-probe accuracy, layer x epoch: one column of panels per target, one row
    per representation, with the accuracy of always guessing the commonest class as a top row.

    ``summary`` is :func:`epochlens.probes.summary.probe_summary`; cells are ``accuracy_mean`` on the
    ``split`` evaluation images (the test split if there is no holdout). Grey cells: the target
    was skipped at that epoch (no old classes yet, no curvature computed) or not evaluated there.
    """
    ok = summary[summary["status"] == "ok"]
    if split not in set(ok["eval_split"]):
        split = "test"
    ok = ok[ok["eval_split"] == split]
    targets = list(pd.unique(summary["target"]))
    reps = list(pd.unique(summary["representation"]))
    layers = list(pd.unique(summary["layer"]))
    epochs = sorted(int(e) for e in summary["epoch"].unique())
    rows = ["chance", *layers]
    annotate = len(epochs) <= 12 and len(rows) <= 14
    width = min(max(0.5 * len(epochs) + 1.6, 3.4), 9.0)
    height = 0.32 * len(rows) + 1.0
    fig, axes = plt.subplots(
        len(reps),
        len(targets),
        figsize=(width * len(targets) + 1.0, height * len(reps) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    norm = matplotlib.colors.Normalize(0.0, 1.0)
    image = None
    for i, rep in enumerate(reps):
        for j, target in enumerate(targets):
            sub = ok[(ok["representation"] == rep) & (ok["target"] == target)]
            acc = sub.pivot_table(index="layer", columns="epoch", values="accuracy_mean", aggfunc="mean")
            acc = acc.reindex(index=layers, columns=epochs)
            chance = sub.groupby("epoch")["chance"].mean().reindex(epochs)
            matrix = np.vstack([chance.to_numpy(float)[None, :], acc.to_numpy(float)])
            ax = axes[i, j]
            image = _heatmap_panel(ax, matrix, rows, epochs, "viridis", norm, "{:.2f}", annotate, j == 0)
            ax.axhline(0.5, color="w", lw=2)
            if i == 0:
                ax.set_title(_target_label(target), fontsize=9)
            if j == 0:
                ax.set_ylabel(rep, fontsize=9)
            if i == len(reps) - 1:
                ax.set_xlabel("checkpoint epoch", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label=f"{split} accuracy")
    n_idx = int(ok["n_indices"].max()) if len(ok) else 0
    n_seeds = int(ok["n_seeds"].max()) if len(ok) else 0
    fig.suptitle(
        f"{title}: linear-probe accuracy per layer ({split} images; mean of {n_idx} index(es) x "
        f"{n_seeds} probe seed(s); grey: target skipped)",
        fontsize=10,
    )
    return fig


def plot_ablation_effect(summary: pd.DataFrame, title: str, metric: str = "delta_accuracy") -> plt.Figure:
    """Heatmaps of the effect of ablating each unit group, unit group x epoch, on the old and the
    new classes (columns of panels) for each ablation mode (rows of panels).

    ``summary`` is :func:`epochlens.ablation.summary.ablation_summary`; cells are ``{metric}_mean``
    (ablated minus intact; red: the ablation hurts accuracy). The colour scale is symmetric and
    saturates at the 98th percentile of the absolute effects of the channel groups (of the whole
    blocks where there are no groups), so that the small channel-group effects stay visible next to
    whole-block ablations, which mostly saturate; written values are in percentage points.
    """
    cohorts = [c for c in ("old", "new") if c in set(summary["cohort"])]
    modes = list(pd.unique(summary["mode"]))
    groups = list(dict.fromkeys(zip(summary["block"], summary["group"], strict=True)))
    rows = [f"{block} {group}" for block, group in groups]
    epochs = sorted(int(e) for e in summary["epoch"].unique())
    column = f"{metric}_mean"
    shown = summary[summary["cohort"].isin(cohorts)]
    if (shown["group"] != "all").any():
        shown = shown[shown["group"] != "all"]
    values = shown[column].abs().dropna()
    vlim = max(float(np.percentile(values, 98)) if len(values) else 0.0, 0.02)
    norm = matplotlib.colors.Normalize(-vlim, vlim)
    cmap = "RdBu" if "accuracy" in metric else "RdBu_r"  # red: worse
    annotate = len(epochs) <= 12 and len(rows) <= 24
    width = min(max(0.45 * len(epochs) + 2.0, 3.6), 9.0)
    height = 0.26 * len(rows) + 1.0
    fig, axes = plt.subplots(
        len(modes),
        len(cohorts),
        figsize=(width * len(cohorts) + 1.2, height * len(modes) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    image = None
    block_ends = [k for k in range(1, len(groups)) if groups[k][0] != groups[k - 1][0]]
    for i, mode in enumerate(modes):
        for j, cohort in enumerate(cohorts):
            sub = summary[(summary["mode"] == mode) & (summary["cohort"] == cohort)]
            table = sub.pivot_table(index=["block", "group"], columns="epoch", values=column, aggfunc="mean")
            table = table.reindex(index=pd.MultiIndex.from_tuples(groups), columns=epochs)
            matrix = table.to_numpy(float)
            ax = axes[i, j]
            scale = 100.0 if "accuracy" in metric else 1.0
            image = _heatmap_panel(
                ax, matrix * scale, rows, epochs, cmap, _scaled(norm, scale), "{:+.0f}", annotate, j == 0
            )
            for k in block_ends:
                ax.axhline(k - 0.5, color="k", lw=0.6)
            ax.set_title(f"{mode} ablation, {cohort} classes", fontsize=9)
            if i == len(modes) - 1:
                ax.set_xlabel("checkpoint epoch", fontsize=8)
    unit = "percentage points" if "accuracy" in metric else "nats"
    fig.colorbar(image, ax=axes, shrink=0.8, extend="both", label=f"{metric} ({unit}; ablated - intact)")
    split = summary["split"].iloc[0] if "split" in summary and len(summary) else "test"
    n_idx = int(summary["n_indices"].max()) if len(summary) else 0
    fig.suptitle(
        f"{title}: effect of ablating each unit group on {split} {metric.removeprefix('delta_')} "
        f"(mean of {n_idx} index(es); grey: no such classes yet)",
        fontsize=10,
    )
    return fig


def _scaled(norm: matplotlib.colors.Normalize, scale: float) -> matplotlib.colors.Normalize:
    return matplotlib.colors.Normalize(norm.vmin * scale, norm.vmax * scale)


# ------------------------------------------------------------------------------------------------
# Influence and the data-quality study (tables of scripts/poison_detection.py)
# ------------------------------------------------------------------------------------------------

#: Colours of the influence methods and baselines, the same in every influence figure.
METHOD_COLORS = {
    "ekfac": "tab:blue",
    "kfac": "tab:orange",
    "diagonal": "tab:green",
    "identity": "tab:purple",
    "tracin": "tab:brown",
    "loss": "k",
    "random": "0.6",
}


def _latest(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Rows of the last epoch of a table with an ``epoch`` column, and that epoch."""
    epoch = int(df["epoch"].max())
    return df[df["epoch"] == epoch], epoch


def _query_signal(signals) -> str | None:
    """The query-influence signal to show: untransformed queries if scored, else the first transform."""
    names = sorted(s for s in set(signals) if str(s).startswith("query_influence"))
    return "query_influence" if "query_influence" in names else (names[0] if names else None)


def plot_poison_roc(roc: pd.DataFrame, detection: pd.DataFrame, title: str) -> plt.Figure:
    """ROC curves of each influence method finding the corrupted training images, at the last
    influence epoch: one panel per signal (self-influence, influence on the queries), the loss and
    random baselines in each. Legends give the AUROC (mean over replicate indices); each index's
    curve is drawn.
    """
    detection, epoch = _latest(detection) if len(detection) else (detection, 0)
    roc = roc[roc["epoch"] == epoch] if len(roc) else roc
    signals = [s for s in ("self_influence", _query_signal(detection.get("signal", []))) if s]
    fig, axes = plt.subplots(
        1, max(len(signals), 1), figsize=(5.0 * max(len(signals), 1), 4.6), squeeze=False
    )
    auroc = (
        detection.groupby(["method", "signal"])["auroc"].mean() if len(detection) else pd.Series(dtype=float)
    )
    for ax, signal in zip(axes[0], signals or ["(none)"], strict=True):
        shown = [(m, s) for (m, s) in auroc.index if s in (signal, "loss", "random")]
        shown.sort(key=lambda ms: (ms[1] in ("loss", "random"), -np.nan_to_num(auroc[ms], nan=-1.0)))
        for method, sig in shown:
            curves = roc[(roc["method"] == method) & (roc["signal"] == sig)] if len(roc) else roc
            color = METHOD_COLORS.get(method, None)
            style = "--" if method == "loss" else (":" if method == "random" else "-")
            label = f"{method if sig == signal else sig} (AUROC {auroc[(method, sig)]:.3f})"
            for k, (_, curve) in enumerate(curves.groupby("index")):
                ax.plot(
                    curve["fpr"],
                    curve["tpr"],
                    style,
                    color=color,
                    lw=1.4,
                    alpha=0.9,
                    label=label if k == 0 else None,
                )
        ax.plot([0, 1], [0, 1], color="0.85", lw=0.8, zorder=0)
        ax.set_xlabel("false positive rate (clean images flagged)")
        ax.set_ylabel("true positive rate (corrupted images found)")
        ax.set_title(signal.replace("_", " "), fontsize=10)
        ax.set_xlim(-0.01, 1.01)
        ax.set_ylim(-0.01, 1.01)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no corrupted images to find", ha="center", va="center", transform=ax.transAxes)
    n_idx = detection["index"].nunique() if len(detection) else 0
    fig.suptitle(f"{title}: finding the corrupted training images (epoch {epoch}, {n_idx} index(es))")
    fig.tight_layout()
    return fig


def _image_for_display(image: np.ndarray, scale: float) -> tuple[np.ndarray, str | None]:
    """(H, W) or (H, W, 3) in [0, 1] from a stored (C, H, W) image, and the colour map."""
    x = np.clip(np.asarray(image, dtype=np.float64) * scale, 0.0, 1.0)
    if x.shape[0] == 1:
        return x[0], "gray_r"
    return np.transpose(x[:3], (1, 2, 0)), None


def plot_top_influential_images(
    top: pd.DataFrame,
    detection: pd.DataFrame,
    images: np.ndarray,
    scale: float,
    title: str,
    class_names: list[str] | None = None,
    max_images: int = 12,
) -> plt.Figure:
    """The training images each signal ranks most suspicious, with the label they were trained on.

    Rows: the best method (highest AUROC) of each influence signal and the loss baseline, at the
    last epoch of the first replicate index; corrupted images are framed in red.
    ``images`` are the stored training images (N, C, H, W), shown as ``images * scale``.
    """
    top, epoch = _latest(top)
    index = int(top["index"].min())
    top = top[top["index"] == index]
    det = detection[(detection["epoch"] == epoch) & (detection["index"] == index)]
    rows = []
    for signal in ("self_influence", _query_signal(det["signal"])):
        sub = det[(det["signal"] == signal) & det["auroc"].notna()] if signal else det.iloc[:0]
        if len(sub):
            best = sub.loc[sub["auroc"].idxmax()]
            rows.append((best["method"], signal, best["auroc"]))
    for method in ("loss", "random"):
        sub = det[det["method"] == method]
        if len(sub) and method == "loss":
            rows.append((method, method, sub["auroc"].iloc[0]))
    if not rows:  # no corrupted images: show what each signal ranks first anyway
        rows = [
            (m, s, np.nan) for m, s in top[["method", "signal"]].drop_duplicates().itertuples(index=False)
        ][:4]
    k = min(max_images, int(top["rank"].max()) if len(top) else 1)
    fig, axes = plt.subplots(len(rows), k, figsize=(1.1 * k + 1.6, 1.45 * len(rows) + 0.6), squeeze=False)
    for i, (method, signal, auc) in enumerate(rows):
        sub = top[(top["method"] == method) & (top["signal"] == signal)].sort_values("rank")
        for j in range(k):
            ax = axes[i, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(sub):
                ax.axis("off")
                continue
            row = sub.iloc[j]
            picture, cmap = _image_for_display(images[int(row["sample"])], scale)
            ax.imshow(picture, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
            name = class_names[int(row["label"])] if class_names else str(int(row["label"]))
            ax.set_title(
                f"#{int(row['rank'])} y={name}", fontsize=7, color="tab:red" if row["corrupted"] else "k"
            )
            for spine in ax.spines.values():
                spine.set_edgecolor("tab:red" if row["corrupted"] else "0.7")
                spine.set_linewidth(2.5 if row["corrupted"] else 0.6)
        label = signal.replace("_", " ") if method == signal else f"{method}\n{signal.replace('_', ' ')}"
        hits = int(sub["corrupted"].head(k).sum())
        auc_text = "" if np.isnan(auc) else f"\nAUROC {auc:.3f}"
        axes[i, 0].set_ylabel(f"{label}{auc_text}\n{hits}/{min(k, len(sub))} corrupted", fontsize=7)
    fig.suptitle(
        f"{title}: top-ranked training images (epoch {epoch}, index {index}; red: corrupted; "
        "y: label trained on)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def plot_influence_conditioning(conditioning: pd.DataFrame, title: str) -> plt.Figure:
    """Per-layer conditioning of the damped curvature each method inverts (last epoch, first index):
    condition number (max+λ)/(min+λ), and the undamped eigenvalue range with the damping λ used.
    Ladder steps (λ raised where a solve was not finite) are written above the bars.
    """
    cond, epoch = _latest(conditioning)
    index = int(cond["index"].min())
    cond = cond[(cond["index"] == index) & cond["cond"].notna()]
    methods = [m for m in pd.unique(cond["method"])]
    layers = list(pd.unique(cond["layer"]))
    fig, (ax_cond, ax_eig) = plt.subplots(1, 2, figsize=(max(9.0, 1.3 * len(layers) + 6), 4.4))
    width = 0.8 / max(len(methods), 1)
    x = np.arange(len(layers))
    for k, method in enumerate(methods):
        sub = cond[cond["method"] == method].set_index("layer").reindex(layers)
        color = METHOD_COLORS.get(method)
        offset = (k - (len(methods) - 1) / 2) * width
        ax_cond.bar(x + offset, sub["cond"], width, color=color, label=method)
        for xi, steps, value in zip(x + offset, sub["damping_steps"], sub["cond"], strict=True):
            if np.isfinite(steps) and steps > 0:
                ax_cond.text(xi, value, f"+{int(steps)}", ha="center", va="bottom", fontsize=6)
        ax_eig.vlines(x + offset, sub["min_eig"].where(sub["min_eig"] > 0), sub["max_eig"], color=color, lw=2)
        ax_eig.scatter(x + offset, sub["max_eig"], color=color, s=14, label=f"{method} eigenvalues")
        ax_eig.scatter(x + offset, sub["damping"], color=color, marker="_", s=120)
    for ax in (ax_cond, ax_eig):
        ax.set_yscale("log")
        ax.set_xticks(x, layers, rotation=45, ha="right", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    ax_cond.set_ylabel("condition number of G + λI")
    ax_cond.set_title("conditioning of the inverted curvature", fontsize=10)
    ax_eig.set_ylabel("eigenvalue")
    ax_eig.set_title("undamped eigenvalues (bar: min..max, dot: max) and damping λ (dash)", fontsize=9)
    if methods:
        ax_cond.legend(fontsize=7)
    else:
        ax_cond.text(
            0.5, 0.5, "no curvature (identity / tracin only)", ha="center", transform=ax_cond.transAxes
        )
    fig.suptitle(f"{title}: per-layer conditioning (epoch {epoch}, index {index})")
    fig.tight_layout()
    return fig
