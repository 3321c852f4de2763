"""Influence figures: ROC curves per method, the top-ranked training images, per-layer conditioning."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from epochlens.plotting.common import METHOD_COLORS


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
        ax.set_xlabel("false positive rate (clean samples flagged)")
        ax.set_ylabel("true positive rate (corrupted samples found)")
        ax.set_title(signal.replace("_", " "), fontsize=10)
        ax.set_xlim(-0.01, 1.01)
        ax.set_ylim(-0.01, 1.01)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
        else:
            ax.text(
                0.5, 0.5, "no corrupted samples to find", ha="center", va="center", transform=ax.transAxes
            )
    n_idx = detection["index"].nunique() if len(detection) else 0
    fig.suptitle(f"{title}: finding the corrupted training samples (epoch {epoch}, {n_idx} index(es))")
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
    top, epoch, index, rows = _signal_rows(top, detection)
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
        axes[i, 0].set_ylabel(_row_label(method, signal, auc, sub, k), fontsize=7)
    fig.suptitle(
        f"{title}: top-ranked training images (epoch {epoch}, index {index}; red: corrupted; "
        "y: label trained on)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def plot_top_influential_texts(
    top: pd.DataFrame,
    detection: pd.DataFrame,
    texts: Sequence[str] | Mapping[int, str],
    title: str,
    class_names: list[str] | None = None,
    max_texts: int = 8,
    width: int = 70,
) -> plt.Figure:
    """The training texts each signal ranks most suspicious (as :func:`plot_top_influential_images`
    for a text run): one panel per signal, its top ``max_texts`` texts with the label they were
    trained on, corrupted ones in red; texts longer than ``width`` characters are shortened. A
    regression's ``top`` has no label column: ``texts`` are then each sample's target, as text."""
    top, epoch, index, rows = _signal_rows(top, detection)
    k = min(max_texts, int(top["rank"].max()) if len(top) else 1)
    fig, axes = plt.subplots(len(rows), 1, figsize=(8.5, 0.24 * k * len(rows) + 0.5 * len(rows) + 0.6))
    axes = np.atleast_1d(axes)
    for ax, (method, signal, auc) in zip(axes, rows, strict=True):
        sub = top[(top["method"] == method) & (top["signal"] == signal)].sort_values("rank").head(k)
        ax.set_axis_off()
        ax.set_title(_row_label(method, signal, auc, sub, k).replace("\n", ", "), fontsize=8, loc="left")
        for j, row in enumerate(sub.itertuples(index=False)):
            text = texts[int(row.sample)]
            text = text if len(text) <= width else text[: width - 1] + "…"
            if hasattr(row, "label"):
                name = class_names[int(row.label)] if class_names else str(int(row.label))
                line = f"#{int(row.rank):<3d} y={name:<10s} {text}"
            else:  # a regression: its text is the target trained on
                line = f"#{int(row.rank):<3d} {text}"
            ax.text(
                0.0,
                1.0 - (j + 0.5) / k,
                line,
                transform=ax.transAxes,
                fontsize=7.5,
                family="monospace",
                va="center",
                color="tab:red" if row.corrupted else "k",
            )
    what = "y: label trained on" if "label" in top else "y: target trained on"
    kind = "texts" if "label" in top else "samples"
    fig.suptitle(
        f"{title}: top-ranked training {kind} (epoch {epoch}, index {index}; red: corrupted; {what})",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def _row_label(method: str, signal: str, auc: float, sub: pd.DataFrame, k: int) -> str:
    label = signal.replace("_", " ") if method == signal else f"{method}\n{signal.replace('_', ' ')}"
    hits = int(sub["corrupted"].head(k).sum())
    auc_text = "" if np.isnan(auc) else f"\nAUROC {auc:.3f}"
    return f"{label}{auc_text}\n{hits}/{min(k, len(sub))} corrupted"


def _signal_rows(top: pd.DataFrame, detection: pd.DataFrame) -> tuple[pd.DataFrame, int, int, list]:
    """The last epoch's first index of ``top`` and the (method, signal, AUROC) shown: the best
    method of each influence signal and the loss baseline (what each ranks first, without
    corrupted samples)."""
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
    if not rows:  # no corrupted samples: show what each signal ranks first anyway
        rows = [
            (m, s, np.nan) for m, s in top[["method", "signal"]].drop_duplicates().itertuples(index=False)
        ][:4]
    return top, epoch, index, rows


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
