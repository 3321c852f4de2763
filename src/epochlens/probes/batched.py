"""Softmax probes of many layers and seeds fitted together: the algorithm of
:func:`epochlens.probes.softmax.train_linear_probe`, as batched tensor operations.

A group of G layers with the same feature width D (one representation, one target) and S seeds
gives P = G x S probes. Each probe is what :func:`~epochlens.probes.softmax.probe_seeds` fits one at
a time: the seed's stratified early-stopping split, weights from zero, the seed's mini-batch order
(one ``randperm`` per epoch from ``Generator().manual_seed(seed)``), Adam on the mean cross-entropy
plus ``0.5 * weight_decay * ||W||²``, the epoch of the lowest early-stopping loss kept, stopped after
``patience`` epochs without a decrease of ``min_delta``. Here every step of every probe is one
gather of the G x S mini-batches and two batched matrix products; the gradient is the closed form
of softmax regression, and Adam (torch's update, step for step) runs on the stacked weights. A
probe that stops is left out of the next epochs (its best weights are kept).

The standardisation ((x - mean) / scale with the seed's fit samples' statistics) is folded into the
weights (logits = x (W / scale) + b - (mean / scale) W), so the features are never copied per seed.
Results equal one-at-a-time fitting up to rounding (tested: the same accuracies within 0.01, the
same best epochs but for ties). On CUDA with ``mixed_precision`` the two matrix products run in
bfloat16 under autocast, accumulated in float32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from epochlens.errors import ProbeError
from epochlens.probes.fits import BETAS, EPS, BatchedFit, SeedSplit, _adam  # noqa: F401 (public here too)
from epochlens.probes.plan import probe_plan
from epochlens.probes.settings import ProbeSettings

#: Most bytes of the mini-batches gathered in one step: beyond, the layers are fitted in several
#: groups (16 layers x 10 seeds x 512 x 768 floats gathered per step ran no faster than one probe
#: at a time on the CPU; 4 layers ran 1.9x faster, 16 layers of 6-8 features 10x).
STEP_BYTES = 32 << 20


def _stats(
    x: torch.Tensor, splits: Sequence[SeedSplit], standardize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, D) mean and scale of each (layer, seed)'s fit samples (float64 sums, population std)."""
    g, _, d = x.shape
    if not standardize:
        ones = torch.ones(g * len(splits), d, device=x.device)
        return torch.zeros_like(ones), ones
    means, scales = [], []
    for split in splits:
        rows = x[:, split.fit].double()  # (G, n, D)
        mean = rows.mean(1)
        std = (rows - mean[:, None]).square().mean(1).sqrt()
        means.append(mean.float())
        scales.append(torch.where(std > 0, std, torch.ones_like(std)).float())
    # layer-major: probe p = layer * S + seed
    return torch.stack(means, 1).reshape(-1, d), torch.stack(scales, 1).reshape(-1, d)


def _logits(
    xb: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor, amp: bool
):
    """Logits (P, B, K) of raw features (P, B, D) for standardised weights."""
    ws = w / scale[:, :, None]
    bias = b - torch.einsum("pd,pdk->pk", mean / scale, w)
    with torch.autocast(device_type=xb.device.type, dtype=torch.bfloat16, enabled=amp):
        z = torch.bmm(xb, ws)
    return z.float() + bias[:, None, :]


def stop_losses(x, y, splits, w, b, mean, scale, layers, probes, amp) -> torch.Tensor:
    """(len(probes),) mean cross-entropy of each probe on its seed's early-stopping samples."""
    s = len(splits)
    out = torch.empty(len(probes), device=x.device)
    for seed in range(s):
        pick = torch.nonzero(probes % s == seed).flatten()
        if len(pick) == 0:
            continue
        p = probes[pick]
        rows = splits[seed].stop
        z = _logits(x[layers[p][:, None], rows[None, :]], w[pick], b[pick], mean[p], scale[p], amp)
        out[pick] = F.cross_entropy(z.transpose(1, 2), y[rows].expand(len(p), -1), reduction="none").mean(1)
    return out


def train_batched(
    x: torch.Tensor,
    y: torch.Tensor,
    splits: Sequence[SeedSplit],
    seeds: Sequence[int],
    n_classes: int,
    settings: ProbeSettings,
    amp: bool = False,
) -> BatchedFit:
    """Fit the probes of every layer of ``x`` (G, N, D) and every seed (module doc).

    ``y``: (N,) int64 targets (defined on every fit and stop row); ``splits[s]``: seed ``seeds[s]``'s
    rows, every seed with as many fit rows (stratified splits hold the same count per class out).
    """
    g, _, d = x.shape
    s = len(splits)
    if len({len(sp.fit) for sp in splits}) != 1:
        raise ProbeError("batched probes need every seed to fit as many samples; fit them one at a time.")
    n, p = len(splits[0].fit), g * s
    layers = torch.arange(p, device=x.device) // s
    mean, scale = _stats(x, splits, settings.standardize)
    state = _State.zeros(p, d, n_classes, x.device)
    gens = [torch.Generator(device="cpu").manual_seed(int(seed)) for seed in seeds]
    active = torch.arange(p, device=x.device)
    best = stop_losses(x, y, splits, state.w, state.b, mean, scale, layers, active, amp)
    state.keep_best(active, best, torch.ones(p, dtype=torch.bool, device=x.device), 0)
    since, epochs_run = torch.zeros(p, dtype=torch.long), [settings.max_epochs] * p
    fits = torch.stack([sp.fit for sp in splits])  # (S, n)
    for epoch in range(1, settings.max_epochs + 1):
        orders = torch.stack([torch.randperm(n, generator=gen) for gen in gens]).to(x.device)
        _epoch(x, y, fits, orders, state, mean, scale, layers, active, settings, amp)
        current = stop_losses(
            x, y, splits, state.w[active], state.b[active], mean, scale, layers, active, amp
        )
        if not torch.isfinite(current).all():
            raise ProbeError(
                f"probe loss became non-finite at epoch {epoch}: features with extreme values. Keep "
                "standardize on or lower lr."
            )
        improved = current < best[active] - settings.min_delta
        best[active] = torch.where(improved, current, best[active])
        state.keep_best(active, current, improved, epoch)
        since[active.cpu()] = torch.where(improved.cpu(), 0, since[active.cpu()] + 1)
        done = since[active.cpu()] >= settings.patience
        for probe in active[done.to(x.device)].tolist():
            epochs_run[probe] = epoch
        active = active[~done.to(x.device)]
        if len(active) == 0:
            break
    return BatchedFit(state.best_w, state.best_b, mean, scale, state.best_epoch.tolist(), epochs_run)


@dataclass
class _State:
    """Weights, Adam moments, step count and best weights of P probes."""

    w: torch.Tensor
    b: torch.Tensor
    m_w: torch.Tensor
    v_w: torch.Tensor
    m_b: torch.Tensor
    v_b: torch.Tensor
    best_w: torch.Tensor
    best_b: torch.Tensor
    best_epoch: torch.Tensor
    step: int = 0

    @classmethod
    def zeros(cls, p: int, d: int, k: int, device: torch.device) -> _State:
        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, device=device)

        return cls(z(p, d, k), z(p, k), z(p, d, k), z(p, d, k), z(p, k), z(p, k), z(p, d, k), z(p, k),
                   torch.zeros(p, dtype=torch.long))  # fmt: skip

    def keep_best(self, probes: torch.Tensor, loss: torch.Tensor, improved: torch.Tensor, epoch: int) -> None:
        keep = probes[improved]
        self.best_w[keep] = self.w[keep]
        self.best_b[keep] = self.b[keep]
        self.best_epoch[keep.cpu()] = epoch


def _epoch(x, y, fits, orders, state, mean, scale, layers, active, settings, amp) -> None:
    """One pass of every active probe over its seed's fit samples in its seed's order."""
    s, n = fits.shape
    w, b = state.w[active], state.b[active]
    m_w, v_w, m_b, v_b = (t[active] for t in (state.m_w, state.v_w, state.m_b, state.v_b))
    mu, sd, lay = mean[active], scale[active], layers[active]
    seed = active % s
    step = state.step
    for lo in range(0, n, settings.batch_size):
        rows = fits.gather(1, orders[:, lo : lo + settings.batch_size])  # (S, B)
        xb = x[lay[:, None], rows[seed]]  # (A, B, D)
        yb = y[rows[seed]]  # (A, B)
        z = _logits(xb, w, b, mu, sd, amp)
        # softmax written out: torch.softmax over a last dimension of ~10 took 6x as long on the CPU
        grad_z = (z - z.amax(2, keepdim=True)).exp_()
        grad_z /= grad_z.sum(2, keepdim=True)
        grad_z.scatter_add_(2, yb[:, :, None], torch.full_like(yb[:, :, None], -1, dtype=grad_z.dtype))
        grad_z /= yb.shape[1]
        with torch.autocast(device_type=xb.device.type, dtype=torch.bfloat16, enabled=amp):
            xg = torch.bmm(xb.transpose(1, 2), grad_z)
        col = grad_z.sum(1)  # (A, K)
        g_w = (xg.float() - mu[:, :, None] * col[:, None, :]) / sd[:, :, None]
        if settings.weight_decay:
            g_w = g_w + settings.weight_decay * w
        step += 1
        _adam(w, g_w, m_w, v_w, step, settings.lr)
        _adam(b, col, m_b, v_b, step, settings.lr)
    state.step = step
    state.w[active], state.b[active] = w, b
    state.m_w[active], state.v_w[active], state.m_b[active], state.v_b[active] = m_w, v_w, m_b, v_b


def evaluate(
    fit: BatchedFit,
    x: torch.Tensor,
    y: torch.Tensor,
    probe: int,
    layer: int,
    rows: torch.Tensor,
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of one probe on ``rows`` of its layer."""
    if len(rows) == 0:
        return math.nan, math.nan
    xs = (x[layer, rows] - fit.mean[probe]) / fit.scale[probe]
    z = xs @ fit.weight[probe] + fit.bias[probe]
    return float((z.argmax(1) == y[rows]).float().mean()), float(F.cross_entropy(z, y[rows]))


def batched_rows(
    x: torch.Tensor,
    y: np.ndarray,
    fit_mask: np.ndarray,
    eval_masks: Mapping[str, np.ndarray],
    settings: ProbeSettings,
    amp: bool = False,
) -> list[list[dict]]:
    """:func:`epochlens.probes.softmax.probe_seeds` of each layer of ``x`` (G, N, D) at once: per
    layer, its rows (seed, evaluation set) with the same keys and order. ``settings.batch_order``
    ``shared``: the seeds of a layer on shared mini-batches (:mod:`epochlens.probes.shared_order`)."""
    plan = probe_plan(y, fit_mask, eval_masks, settings, x.device)
    y_dev = torch.as_tensor(np.asarray(y, dtype=np.int64)).to(x.device)
    splits = [SeedSplit(fit, stop if len(stop) else fit) for fit, stop in plan.seed_rows]
    step = len(settings.seeds) * settings.batch_size * x.shape[2] * 4  # bytes of a layer's mini-batches
    per_fit, group_rows = max(1, STEP_BYTES // step), _group_rows
    if settings.batch_order == "shared":  # one mini-batch per layer, whatever the seeds
        from epochlens.probes.shared_order import layers_per_fit, shared_rows

        per_fit, group_rows = layers_per_fit(splits, settings.batch_size, x.shape[2]), shared_rows
    out = []
    for lo in range(0, x.shape[0], per_fit):
        out += group_rows(x[lo : lo + per_fit], y_dev, splits, plan, settings, amp)
    return out


def _group_rows(x, y_dev, splits, plan, settings, amp) -> list[list[dict]]:
    fit = train_batched(x, y_dev, splits, settings.seeds, plan.n_classes, settings, amp)
    s = len(settings.seeds)
    out = []
    for layer in range(x.shape[0]):
        rows = []
        for i, seed in enumerate(settings.seeds):
            p = layer * s + i
            fit_rows, stop_rows = plan.seed_rows[i]
            fit_acc, _ = evaluate(fit, x, y_dev, p, layer, fit_rows)
            for name, ev in plan.eval_sets.items():
                acc, loss = evaluate(fit, x, y_dev, p, layer, ev)
                rows.append(
                    plan.row(
                        seed, name, x.shape[2], len(fit_rows), len(stop_rows), len(ev), acc, loss, fit_acc
                    )
                    | {"best_epoch": fit.best_epoch[p], "epochs_run": fit.epochs_run[p]}
                )
        out.append(rows)
    return out
