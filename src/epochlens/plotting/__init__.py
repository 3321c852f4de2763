"""Figures of every stage, drawn from the run's tidy tables (matplotlib; never imports torch).

* :mod:`.common`     saving as PNG and PDF, replicate bands, colours, heatmap panels;
* :mod:`.accuracy`   accuracy by cohort and training curves;
* :mod:`.curvature`  curvature by cohort, its distribution, curvature vs loss;
* :mod:`.probes`     probe accuracy heatmaps;
* :mod:`.ablation`   ablation effect heatmaps;
* :mod:`.influence`  ROC curves, top-ranked images, per-layer conditioning.

Scripts import the module of their stage, so that editing one stage's figures redraws only those.
"""

import matplotlib

matplotlib.use("Agg")  # files only, no display: before any module imports pyplot
