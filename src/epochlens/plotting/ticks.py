"""Log axes labelled in plain text: 10⁻³ at the decades, 2.25 between them.

matplotlib labels log axes with mathtext (``$\\mathdefault{10^{-3}}$``): parsing it is most of
a curvature figure's drawing time, and on an axis spanning less than a decade its labels
(``2.25\\times10^{0}``) run into each other. The formatter below keeps matplotlib's choice of
which ticks get a label and writes them as text (Unicode superscripts, which DejaVu Sans has).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib import ticker

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


class PlainLogFormatter(ticker.LogFormatter):
    """matplotlib's :class:`~matplotlib.ticker.LogFormatter`, a label written as 10⁻³ at a decade
    and with 3 significant digits elsewhere."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        exponent = math.log10(x)
        if abs(exponent - round(exponent)) < 1e-10:
            return "10" + str(round(exponent)).translate(_SUPERSCRIPT)
        return f"{x:.3g}"


def plain_log_labels(fig: plt.Figure) -> None:
    """Give every base-10 log axis of ``fig`` (x or y) :class:`PlainLogFormatter` labels."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log" and getattr(axis.get_transform(), "base", None) == 10:
                axis.set_major_formatter(PlainLogFormatter())
                axis.set_minor_formatter(PlainLogFormatter())
