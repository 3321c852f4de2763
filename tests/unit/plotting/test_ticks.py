"""Log axes carry plain-text labels (epochlens.plotting.ticks): decades as 10⁻³, values of an axis
spanning less than a decade with 3 digits, and no label running into the next."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from epochlens.plotting.ticks import plain_log_labels  # noqa: E402


def labels(axis) -> list:
    return [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]


def test_log_axes_are_labelled_in_plain_text_without_overlaps():
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.scatter([2.2, 2.3, 2.45], [1e-4, 1e-2, 3.0])
    ax.set_xscale("log")  # less than a decade: matplotlib labels values between decades
    ax.set_yscale("log")
    plain_log_labels(fig)
    fig.canvas.draw()
    x, y = labels(ax.xaxis), labels(ax.yaxis)
    assert {"10⁻⁴", "10⁻²", "10⁰"} <= {t.get_text() for t in y}
    assert "2.3" in {t.get_text() for t in x} and len(x) >= 3
    assert not any("$" in t.get_text() for t in x + y)  # no mathtext
    renderer = fig.canvas.get_renderer()
    boxes = sorted((t.get_window_extent(renderer) for t in x), key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False)), [t.get_text() for t in x]
    plt.close(fig)
