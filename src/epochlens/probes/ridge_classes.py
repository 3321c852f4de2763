"""The closed-form ridge probe of class targets (``probes.kind: ridge``), many layers and seeds at once.

Each probe is scikit-learn's ``RidgeClassifier(alpha=alpha * n_fit)`` on the seed's fit samples,
standardised with their mean and (population) standard deviation as the softmax probes are
(:mod:`epochlens.probes.linear`; a constant feature keeps scale 1, so its coefficient is 0):

* targets: one column per class, +1 for the sample's class and -1 for the others
  (RidgeClassifier's {-1, 1} coding; for two classes it keeps one column, the second class's: ours
  are that column and its negative, so predictions and that column's coefficients are the same);
* ``min_W,b (1 / n_fit) ||T - X W - 1 b||² + alpha ||W||²``: ``alpha`` is a penalty per fit
  sample on standardised features, as for a regression's ridge probe (:mod:`epochlens.probes.ridge`),
  so one grid (``probes.ridge_alphas``) serves data sets of any size;
* prediction: the class of the largest output (ties: the lower class, as RidgeClassifier's).

The splits are the softmax probes' (:func:`epochlens.probes.linear.probe_plan`: per seed a
stratified ``stop_fraction`` of the fit samples held out). Per layer, the Gram matrix X'X, the
column sums and X'T of *all* fit samples are computed once (features shifted by their mean first, so
that float32 keeps its digits); each seed's are those less its held-out rows' (a downdate by
``stop_fraction`` of the rows). Centring and standardisation are folded into that Gram
(``S^-1 (X'X - n m m') S^-1``), which is factorised once per (layer, seed) and gives every penalty:
on the CPU tridiagonalised (:func:`epochlens.probes.ridge.solve_path`), on a GPU eigendecomposed
in one batch (:func:`epochlens.probes.ridge.eigen_path`); the penalty with the best accuracy on the
seed's held-out samples is kept (ties to the larger penalty), as the ridge probe of a regression
keeps its best R². Layers of one width are stacked: the Grams by BLAS, the outputs of every seed's
kept probe by one product per layer.

Rows: those of the softmax probe (:func:`epochlens.probes.softmax.probe_seeds`), so tables, heatmaps
and figures read them unchanged: accuracy, chance, fit_accuracy as there; ``loss`` the mean squared
error of the ±1 targets over samples and classes (not a cross-entropy); best_epoch and epochs_run
empty (no epochs); ``alpha`` the penalty kept.

``settings.ridge_dtype``: ``float64`` (scikit-learn's coefficients to rounding; tested to 1e-6) or
``float32`` (about 1.5-2x faster at 768 features on one CPU thread, coefficients within 1e-5 of
float64's relative to the largest, the same accuracies: benchmarks/probes.py prints both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from epochlens.errors import ProbeError
from epochlens.probes.plan import probe_plan
from epochlens.probes.ridge import eigen_path, solve_path
from epochlens.probes.settings import ProbeSettings

#: Most bytes of the stacked (layers x seeds) Gram matrices and eigenvectors held at once.
GRAM_BYTES = 256 << 20


@dataclass
class ClassRidgeFit:
    """G x S fitted probes: outputs = ((x - mean) / scale) @ coef + intercept; one per penalty."""

    coef: list[torch.Tensor]  # per penalty (G, S, D, K)
    intercept: torch.Tensor  # (S, K), the mean ±1 target of the seed's fit samples
    mean: torch.Tensor  # (G, S, D)
    scale: torch.Tensor  # (G, S, D)
    shift: torch.Tensor  # (G, 1, D), the mean of all fit samples (every seed's)
    n_fit: list[int]  # per seed

    def shifted(self, x: torch.Tensor) -> torch.Tensor:
        """Raw features (G, B, D) less :attr:`shift`, in the fit's dtype: what
        :meth:`outputs` reads with ``shifted=True`` (computed once for every seed)."""
        return x.to(self.shift.dtype) - self.shift

    def outputs(
        self, x: torch.Tensor, seed: int, coef: torch.Tensor | None = None, shifted: bool = False
    ) -> torch.Tensor:
        """Outputs of features (G, B, D) (raw, or :meth:`shifted`) for probe ``seed`` (position) of
        each layer: with ``coef`` (G, D, K), (G, B, K); None: those of every penalty, (A, G, B, K).
        The standardisation is folded into the coefficients, so features are not copied per seed."""
        xc = x if shifted else self.shifted(x)
        outs = []
        for c in [coef] if coef is not None else [c[:, seed] for c in self.coef]:
            weight, bias = self._fold(c[:, None], [seed])
            outs.append(xc @ weight[:, 0] + bias[:, 0, None])
        return outs[0] if coef is not None else torch.stack(outs)

    def kept_outputs(self, xc: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
        """(G, S, B, K) outputs of the :meth:`shifted` features (G, B, D) for the probe of every
        seed of each layer at its penalty ``penalty`` (G, S) (positions): one product per layer
        for all seeds (the features read once, not gathered per seed and evaluation set)."""
        g, s = penalty.shape
        coef = torch.stack([self.kept(i, penalty[:, i]) for i in range(s)], 1)  # (G, S, D, K)
        weight, bias = self._fold(coef, slice(None))
        out = xc @ weight.permute(0, 2, 1, 3).reshape(g, xc.shape[2], -1)  # (G, B, S*K)
        return out.reshape(g, xc.shape[1], s, -1).permute(0, 2, 1, 3) + bias[:, :, None]

    def _fold(self, coef: torch.Tensor, seeds) -> tuple[torch.Tensor, torch.Tensor]:
        """Weights (G, S', D, K) and biases (G, S', K) on :meth:`shifted` features of coefficients
        ``coef`` (G, S', D, K) of the seeds ``seeds`` (an index of the S seeds): the
        standardisation folded in, so that features are not copied per seed."""
        scale = self.scale[:, seeds]
        offset = (self.mean[:, seeds] - self.shift) / scale  # small: shift ~ mean
        return coef / scale[..., None], self.intercept[seeds] - torch.einsum("gsd,gsdk->gsk", offset, coef)

    def kept(self, seed: int, penalty: torch.Tensor) -> torch.Tensor:
        """(G, D, K) coefficients of probe ``seed`` of each layer at its penalty (G,) (positions)."""
        stacked = torch.stack([c[:, seed] for c in self.coef])  # (A, G, D, K)
        return stacked[penalty, torch.arange(len(penalty), device=penalty.device)]


def pm_targets(y: torch.Tensor, n_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """(N, K) targets: +1 in the column of each sample's class, -1 elsewhere."""
    t = torch.full((len(y), n_classes), -1.0, dtype=dtype, device=y.device)
    return t.scatter_(1, y[:, None], 1.0)


def fit_class_ridge(
    x: torch.Tensor,
    t: torch.Tensor,
    seed_rows: Sequence[tuple[torch.Tensor, torch.Tensor]],
    alphas: Sequence[float],
    standardize: bool = True,
) -> ClassRidgeFit:
    """Ridge probes of ±1 targets ``t`` (N, K) on each layer of ``x`` (G, N, D), one per seed and
    penalty (module doc), in the dtype of ``t``.

    ``seed_rows[s]``: seed s's (fit rows, held-out rows), global positions; every seed's fit and
    held-out rows together are the same samples (all fit samples).
    """
    dtype = t.dtype
    fit0, held0 = seed_rows[0]
    every = torch.sort(torch.cat([fit0, held0])).values
    xf = x[:, every].to(dtype)
    shift = xf.mean(1, keepdim=True)  # (G, 1, D)
    xf -= shift
    gram, sums, xty = _gram(xf), xf.sum(1), xf.mT @ t[every]  # once per layer
    del xf
    grams, means, scales, xtys, ybars, counts = [], [], [], [], [], []
    for fit, held in seed_rows:
        xh = x[:, held].to(dtype) - shift
        n = len(fit)
        mean = (sums - xh.sum(1)) / n  # of the shifted features
        ybar = (t[every].sum(0) - t[held].sum(0)) / n
        # centred X'X = X'X - Xh'Xh - n m m', in place (a few D x D passes per seed add up)
        cov = torch.baddbmm(_gram(xh).neg_().add_(gram), mean[:, :, None], mean[:, None, :], alpha=-n)
        var = torch.diagonal(cov, dim1=1, dim2=2).clamp(min=0) / n
        scale = torch.where(var > 0, var.sqrt(), 1.0) if standardize else torch.ones_like(var)
        xtyc = xty - xh.mT @ t[held] - n * mean[:, :, None] * ybar  # centred X'T
        inv = 1 / scale
        grams.append(cov.mul_(inv[:, :, None]).mul_(inv[:, None, :]))
        xtys.append(xtyc * inv[:, :, None])
        means.append(mean + shift[:, 0])
        scales.append(scale)
        ybars.append(ybar)
        counts.append(n)
    coef = _solve(torch.stack(grams, 1), torch.stack(xtys, 1), counts, alphas)
    return ClassRidgeFit(
        coef, torch.stack(ybars), torch.stack(means, 1), torch.stack(scales, 1), shift, counts
    )


def _gram(a: torch.Tensor) -> torch.Tensor:
    """``a' a`` of each layer of ``a`` (G, N, D): on the CPU NumPy's product, which BLAS runs as a
    symmetric rank-k update (0.6x the time of torch's batched product at 7,000 x 768 on one core)."""
    if a.device.type != "cpu":
        return a.mT @ a
    return torch.from_numpy(np.stack([v.T @ v for v in a.contiguous().numpy()]))


def _solve(
    grams: torch.Tensor, xtys: torch.Tensor, counts: Sequence[int], alphas, tridiagonal: bool | None = None
) -> list[torch.Tensor]:
    """Per penalty (G, S, D, K): ``(gram + n_s alpha I)^-1 xty`` of each layer and seed. On the CPU
    (``tridiagonal`` None) one tridiagonalisation per (layer, seed)
    (:func:`epochlens.probes.ridge.solve_path`, a third of an eigendecomposition's time); on a GPU one
    batched eigendecomposition (:func:`epochlens.probes.ridge.eigen_path`)."""
    if tridiagonal is None:
        tridiagonal = grams.device.type == "cpu"
    if not tridiagonal:
        evals, vecs = torch.linalg.eigh(grams)  # (G, S, D), (G, S, D, D)
        n_col = torch.tensor(counts, dtype=grams.dtype, device=grams.device)[:, None]  # (S, 1)
        return eigen_path(evals, vecs, xtys, n_col, alphas)
    g, s, device = *grams.shape[:2], grams.device
    grams, xtys = grams.cpu(), xtys.cpu()
    paths = [
        solve_path(grams[i, j].numpy(), xtys[i, j].numpy(), counts[j], alphas)
        for i in range(g)
        for j in range(s)
    ]
    return [
        torch.from_numpy(np.stack([path[a] for path in paths])).reshape(g, s, *xtys.shape[2:]).to(device)
        for a in range(len(alphas))
    ]


def choose_penalty(
    fit: ClassRidgeFit, xc: torch.Tensor, y: torch.Tensor, seed_rows, alphas: Sequence[float]
) -> torch.Tensor:
    """(G, S) position of the penalty with the best accuracy on each seed's held-out samples (ties
    to the larger penalty; one penalty, or no held-out samples: the only or the largest). ``xc``:
    the features (G, N, D) :meth:`ClassRidgeFit.shifted`."""
    g, s = fit.mean.shape[:2]
    larger_first = sorted(range(len(alphas)), key=lambda i: -alphas[i])
    best = torch.full((g, s), larger_first[0], dtype=torch.long, device=xc.device)
    if len(alphas) == 1:
        return best
    for i, (_, held) in enumerate(seed_rows):
        if len(held) == 0:
            continue
        out = fit.outputs(xc[:, held], i, shifted=True)  # (A, G, B, K)
        acc = (out.argmax(-1) == y[held]).to(torch.float64).mean(-1)  # (A, G)
        ordered = acc[larger_first]  # argmax takes the first of ties: the larger penalty
        best[:, i] = torch.tensor(larger_first, device=xc.device)[ordered.argmax(0)]
    return best


def _chunk_layers(d: int, s: int, itemsize: int) -> int:
    """Layers fitted together: their stacked Grams and eigenvectors within :data:`GRAM_BYTES`."""
    return max(1, GRAM_BYTES // (3 * s * d * d * itemsize))


def class_ridge_rows(
    x: torch.Tensor,
    y: np.ndarray,
    fit_mask: np.ndarray,
    eval_masks: Mapping[str, np.ndarray],
    settings: ProbeSettings,
    layer_names: Sequence[str] | None = None,
) -> list[list[dict]]:
    """The rows of :func:`epochlens.probes.softmax.probe_seeds` for each layer of ``x`` (G, N, D),
    from ridge probes of the classes (module doc): per layer, rows (seed, evaluation set) in the same
    order, with ``alpha``. ``layer_names`` name the layers in errors."""
    names = list(layer_names or [str(i) for i in range(x.shape[0])])
    # a NaN or infinity makes the layer's sum non-finite (a tenth of the time of isfinite on every value)
    bad = [names[i] for i in range(x.shape[0]) if not torch.isfinite(x[i].sum())]
    if bad:
        raise ProbeError(
            f"ridge probe: the features of layer(s) {bad} hold NaN or infinite values (or values so "
            "large that their sum overflows); recompute those features (or fix the representation "
            "that makes them) and probe again."
        )
    alphas = settings.ridge_alphas
    if len(alphas) > 1 and settings.stop_fraction == 0:
        raise ProbeError(
            f"ridge probe: stop_fraction 0 leaves no samples to choose the penalty among {list(alphas)}; "
            "set probes.stop_fraction > 0 or a single penalty (probes.ridge_alphas: [value])."
        )
    plan = probe_plan(y, fit_mask, eval_masks, settings, x.device)
    held = min(len(rows) for _, rows in plan.seed_rows)
    if len(alphas) > 1 and held < 2:
        raise ProbeError(
            f"ridge probe: stop_fraction={settings.stop_fraction} holds out {held} fit sample(s) per "
            f"seed, too few to choose the penalty among {list(alphas)}; raise probes.stop_fraction or "
            "give one penalty (probes.ridge_alphas: [value])."
        )
    dtype = getattr(torch, settings.ridge_dtype)
    y_dev = torch.as_tensor(np.asarray(y, dtype=np.int64), device=x.device)
    t = pm_targets(y_dev.clamp(min=0), plan.n_classes, dtype)  # rows of undefined targets are never read
    step = _chunk_layers(x.shape[2], len(settings.seeds), t.element_size())
    out = []
    for lo in range(0, x.shape[0], step):
        out += _chunk_rows(x[lo : lo + step], y_dev, t, plan, settings)
    return out


def _chunk_rows(x, y, t, plan, settings) -> list[list[dict]]:
    fit = fit_class_ridge(x, t, plan.seed_rows, settings.ridge_alphas, settings.standardize)
    xc = fit.shifted(x)  # once for every seed
    best = choose_penalty(fit, xc, y, plan.seed_rows, settings.ridge_alphas)
    out = fit.kept_outputs(xc, best)  # (G, S, N, K): every sample, the kept probe of every seed
    rows = [[] for _ in range(x.shape[0])]
    for i, seed in enumerate(settings.seeds):
        fit_rows, held = plan.seed_rows[i]
        scores = {name: _scores(out[:, i], y, t, ev) for name, ev in plan.eval_sets.items()}
        fit_acc, _ = _scores(out[:, i], y, t, fit_rows)
        for g in range(x.shape[0]):
            for name, ev in plan.eval_sets.items():
                acc, loss = scores[name]
                row = plan.row(seed, name, x.shape[2], len(fit_rows), len(held), len(ev), float(acc[g]),
                               float(loss[g]), float(fit_acc[g]))  # fmt: skip
                rows[g].append(row | {"alpha": settings.ridge_alphas[int(best[g, i])], "metric": "accuracy"})
    return rows


def _scores(out, y, t, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(G,) accuracy and mean squared error of the ±1 targets of each layer's probe on ``rows``,
    from its outputs ``out`` (G, N, K) of every sample."""
    picked = out[:, rows]
    acc = (picked.argmax(-1) == y[rows]).to(torch.float64).mean(-1)
    loss = (picked - t[rows]).square().mean((-1, -2)).to(torch.float64)
    return acc, loss
