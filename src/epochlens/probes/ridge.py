"""The ridge probe of a regression's targets: closed-form ridge regression in float64 (torch-free).

A layer's features, standardised with the fit samples' mean and standard deviation (as the softmax
probes', :mod:`epochlens.probes.linear`), predict every value of the targets (N,) or (N, D) through

    min_W,b  (1 / n_fit) * ||Y - X W - 1 b||²  +  alpha * ||W||²       (b not penalised)

i.e. scikit-learn's ``Ridge(alpha=alpha * n_fit)``: ``alpha`` is a penalty per fit sample, so one
grid (``ProbeSettings.ridge_alphas``) fits data sets of any size. Every penalty of the grid is
solved from one tridiagonalisation (of X'X, or of XX' where there are fewer samples than features:
:func:`solve_path`).

Per seed, ``stop_fraction`` of the fit samples (a seeded random subset) are held out; the penalty
with the best R² on them is kept and its probe (fitted on the other fit samples) is scored on the
evaluation sets. R² is scikit-learn's ``r2_score`` averaged over the D outputs (``uniform_average``;
an output constant on the evaluation samples counts as r2_score counts it: 1 if predicted exactly,
else 0). Ties between penalties go to the larger one. With a single penalty nothing is held out
(every fit sample is fitted). An evaluation set with fewer than two
samples (R² undefined) gives no rows.

Rows (:func:`ridge_seeds`), one per (seed, evaluation set): seed, eval_split, n_features, n_outputs,
n_fit, n_stop, n_eval, r2, loss (the mean squared error over samples and outputs, in the targets'
units squared), chance (R² of predicting the mean target of all fit samples: 0 up to the difference
between the fit and evaluation means, so slightly below 0), fit_r2 (on the samples fitted), alpha
(the penalty kept), metric ("r2").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from epochlens.errors import ProbeError
from epochlens.probes.settings import ProbeSettings


@dataclass
class RidgeFit:
    """A fitted ridge probe: predictions = ((x - mean) / scale) @ coef + intercept."""

    coef: np.ndarray  # (D_features, K) float64
    intercept: np.ndarray  # (K,)
    mean: np.ndarray  # (D_features,)
    scale: np.ndarray  # (D_features,)
    alpha: float  # penalty per fit sample

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(N, K) float64 predictions of features (N, D_features)."""
        return ((np.asarray(x, dtype=np.float64) - self.mean) / self.scale) @ self.coef + self.intercept


def fit_ridge_path(
    x: np.ndarray, y: np.ndarray, alphas: Sequence[float], standardize: bool = True
) -> list[RidgeFit]:
    """Ridge probes of targets ``y`` on features ``x`` for each penalty of ``alphas`` (module doc).

    Args:
        x: (N, D_features) features of the fit samples.
        y: (N,) or (N, K) targets (a (N,) target gives K = 1).
        alphas: penalties per fit sample, each > 0.
        standardize: z-score the features with their mean and std (a constant feature: scale 1).

    Returns:
        One :class:`RidgeFit` per penalty, in the order of ``alphas``.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    y = y[:, None] if y.ndim == 1 else y
    n, d = x.shape
    if n < 1 or len(y) != n:
        raise ProbeError(f"ridge probe: {n} feature rows for {len(y)} targets; need one per sample, >= 1.")
    if not all(a > 0 for a in alphas):
        raise ProbeError(f"ridge probe: penalties {list(alphas)} must all be > 0.")
    mean = x.mean(0) if standardize else np.zeros(d)
    scale = x.std(0) if standardize else np.ones(d)
    scale = np.where(scale > 0, scale, 1.0)
    xs = (x - mean) / scale
    y_mean = y.mean(0)
    yc = y - y_mean
    if n >= d:  # primal: (X'X + n alpha I) W = X'Y
        coefs = solve_path(xs.T @ xs, xs.T @ yc, n, alphas)
    else:  # dual: W = X' (XX' + n alpha I)^-1 Y
        coefs = [xs.T @ c for c in solve_path(xs @ xs.T, yc, n, alphas)]
    return [RidgeFit(c, y_mean, mean, scale, float(a)) for a, c in zip(alphas, coefs, strict=True)]


def solve_path(gram: np.ndarray, rhs: np.ndarray, n, alphas: Sequence[float]) -> list[np.ndarray]:
    """``(A + n alpha I)^-1 B`` for each penalty of ``alphas``: ``gram`` A (D, D) symmetric positive
    semi-definite, ``rhs`` B (D, K), float32 or float64 NumPy arrays (the result's dtype).

    One Householder tridiagonalisation ``A = Q T Q'`` (LAPACK ``sytrd``: 15 ms at D = 768 in float32
    on one core, against 44 ms for the eigendecomposition of :func:`eigen_path`), then per penalty a
    positive definite tridiagonal solve (``ptsv``, O(D K)), and Q applied to every penalty's
    solution at once (``ormqr`` on the reflectors, as LAPACK's ``ormtr`` does). Equal to
    :func:`eigen_path` up to rounding; where rounding makes a penalty's system not positive
    definite (A's smallest eigenvalues below ``-n alpha``), every penalty is solved by
    :func:`eigen_path` (which counts eigenvalues below 0 as 0).
    """
    from scipy.linalg import lapack

    gram = np.asarray(gram)
    rhs = np.asarray(rhs, dtype=gram.dtype)
    d, k = rhs.shape
    if d < 2 or gram.dtype not in (np.float32, np.float64):
        evals, vecs = np.linalg.eigh(gram)
        return eigen_path(evals, vecs, rhs, n, alphas)
    sytrd, ormqr, ptsv, lwork = lapack.get_lapack_funcs(("sytrd", "ormqr", "ptsv", "sytrd_lwork"), (gram,))
    reflectors, diag, off, tau, info = sytrd(gram, lower=1, lwork=int(lwork(d)[0]))
    if info != 0:
        raise ProbeError(f"ridge probe: LAPACK sytrd failed (info {info}) on a {d} x {d} Gram matrix.")
    # Q = H(1) .. H(d-1) acts on rows 1..d-1 (lower: the reflectors below the first subdiagonal)
    v, tau = reflectors[1:, :-1], tau[: d - 1]
    projected = rhs.copy()
    projected[1:] = ormqr("L", "T", v, tau, rhs[1:], lwork=max(1, 64 * k))[0]
    solved = []
    for a in alphas:
        *_, z, info = ptsv(diag + n * a, off, projected)
        if info != 0:  # not positive definite in floating point
            evals, vecs = np.linalg.eigh(gram)
            return eigen_path(evals, vecs, rhs, n, alphas)
        solved.append(z)
    z = np.concatenate(solved, axis=1)
    z[1:] = ormqr("L", "N", v, tau, z[1:], lwork=max(1, 64 * z.shape[1]))[0]
    return [z[:, i * k : (i + 1) * k] for i in range(len(alphas))]


def eigen_path(evals, vecs, xty, n, alphas: Sequence[float]) -> list:
    """Ridge coefficients ``(X'X + n alpha I)^-1 X'Y`` for each penalty of ``alphas`` from one
    eigendecomposition ``X'X = vecs diag(evals) vecs'`` (eigenvalues below 0, rounding, count as 0).

    NumPy arrays or torch tensors, stacked over any leading dimensions: ``evals`` (..., D), ``vecs``
    (..., D, D), ``xty`` (..., D, K); ``n`` a number or an array (..., 1) of sample counts. Returns
    one (..., D, K) array per penalty (the class probes of :mod:`epochlens.probes.ridge_classes`
    solve theirs here, batched over layers and seeds).
    """
    proj = vecs.mT @ xty
    evals = evals.clip(0)
    return [vecs @ (proj / (evals + n * a)[..., None]) for a in alphas]


def r2(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """scikit-learn's ``r2_score`` averaged over outputs (``uniform_average``); NaN for < 2 samples
    (:func:`epochlens.stats.r2_score`, without importing scikit-learn)."""
    from epochlens.stats import r2_score

    return r2_score(y_true, y_pred)


def random_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions 0..n-1 split into sorted (keep, held), ``round(fraction * n)`` held (at most n - 2,
    so that two samples stay to fit). Deterministic given ``seed``."""
    k = min(int(round(fraction * n)), max(n - 2, 0))
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[k:]), np.sort(order[:k])


def ridge_seeds(
    x: np.ndarray,
    y: np.ndarray,
    fit_mask: np.ndarray,
    eval_masks: Mapping[str, np.ndarray],
    settings: ProbeSettings | None = None,
) -> list[dict]:
    """Fit one ridge probe per seed (penalty chosen on its held-out samples) and score it.

    Args:
        x: (N, D_features) features of every sample.
        y: (N,) or (N, K) float targets; rows with a NaN are undefined (left out everywhere).
        fit_mask: (N,) bool, the samples to fit (and to draw the held-out samples from).
        eval_masks: name -> (N,) bool, the evaluation sets (e.g. holdout, test).
        settings: seeds, stop_fraction, standardize and ridge_alphas.

    Returns:
        One dict per (seed, evaluation set) with the keys of the module doc.
    """
    settings = settings or ProbeSettings()
    x = np.asarray(x)
    y = np.asarray(y, dtype=np.float64)
    y2 = y.reshape(len(y), -1)
    if len(x) != len(y) or len(fit_mask) != len(y) or any(len(m) != len(y) for m in eval_masks.values()):
        raise ProbeError(
            f"features ({len(x)} rows), targets ({len(y)}), fit mask ({len(fit_mask)}) and "
            "evaluation masks must all have one entry per sample"
        )
    defined = np.isfinite(y2).all(1)
    fit_pos = np.flatnonzero(np.asarray(fit_mask, dtype=bool) & defined)
    alphas = settings.ridge_alphas
    if len(fit_pos) < 2:
        raise ProbeError(f"{len(fit_pos)} fit sample(s) with a target: a ridge probe needs at least two.")
    if len(alphas) > 1 and round(settings.stop_fraction * len(fit_pos)) < 2:
        raise ProbeError(
            f"stop_fraction={settings.stop_fraction} of {len(fit_pos)} fit samples leaves fewer than two "
            f"to choose the ridge penalty among {list(alphas)}: raise probes.stop_fraction, or give one "
            "penalty (probes.ridge_alphas: [value])."
        )
    evals = {}
    for name, mask in eval_masks.items():
        ev = np.flatnonzero(np.asarray(mask, dtype=bool) & defined)
        if len(ev) >= 2:  # R² needs two samples
            evals[name] = ev
    fit_mean = y2[fit_pos].mean(0)  # the constant guess (chance): seed-independent, as a majority class
    chance = {name: r2(y2[ev], np.broadcast_to(fit_mean, y2[ev].shape)) for name, ev in evals.items()}
    rows = []
    for seed in settings.seeds:
        keep, held = random_split(len(fit_pos), settings.stop_fraction if len(alphas) > 1 else 0.0, seed)
        fit_idx, stop_idx = fit_pos[keep], fit_pos[held]
        probe = _chosen_probe(
            fit_ridge_path(x[fit_idx], y2[fit_idx], alphas, settings.standardize), x, y2, stop_idx
        )
        fit_r2 = r2(y2[fit_idx], probe.predict(x[fit_idx]))
        for name, ev in evals.items():
            pred = probe.predict(x[ev])
            rows.append(
                {
                    "seed": seed,
                    "eval_split": name,
                    "n_features": int(x.shape[1]),
                    "n_outputs": int(y2.shape[1]),
                    "n_fit": len(keep),
                    "n_stop": len(held),
                    "n_eval": len(ev),
                    "r2": r2(y2[ev], pred),
                    "loss": float(np.mean((pred - y2[ev]) ** 2)),
                    "chance": chance[name],
                    "fit_r2": fit_r2,
                    "alpha": probe.alpha,
                    "metric": "r2",
                }
            )
    return rows


def _chosen_probe(fits: list, x: np.ndarray, y2: np.ndarray, stop_idx: np.ndarray):
    """The fit of the penalty with the best R² on the held-out samples ``stop_idx`` (ties, and
    rounding-level differences, to the larger penalty); the one fit when there is one penalty."""
    if len(fits) == 1:
        return fits[0]
    scores = [r2(y2[stop_idx], f.predict(x[stop_idx])) for f in fits]
    if not np.isfinite(scores).any():
        raise ProbeError(f"ridge probe: no finite R² on the {len(stop_idx)} held-out samples.")
    best_score = np.nanmax(scores)
    return max((fits[i] for i, s in enumerate(scores) if s >= best_score - 1e-12), key=lambda f: f.alpha)
