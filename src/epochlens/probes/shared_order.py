"""Softmax probes of many layers and seeds on shared mini-batches (``probes.batch_order: shared``).

:mod:`epochlens.probes.batched` fits each (layer, seed) probe in its seed's own mini-batch order,
as one at a time: every step gathers G x S mini-batches and multiplies each by its probe's K
columns. Here the S seeds of a layer draw the same mini-batches:

* each epoch, one permutation of the union of the seeds' fit rows (``torch.randperm`` from
  ``Generator().manual_seed(seeds[0])``: the first seed's generator, one draw per epoch), cut into
  batches of ``batch_size`` x M / n rows (M: the union's rows, n: a seed's fit rows, on average
  over the seeds), so that a seed has ``batch_size`` of its own rows in a batch on average and as
  many steps per epoch as alone (with ``batch_size`` rows a batch, stop_fraction 0.15 gave it 18%
  more steps per epoch and accuracies 0.004-0.007 lower on average, 768 features, best epoch the
  first or second);
* a seed sees only its own fit rows of a batch: its early-stopping rows (the fit rows of other
  seeds) get weight zero, its loss and gradient are the mean over its rows in the batch, and a
  batch without one of its rows is no step for it (its Adam step count does not move). Each seed
  still sees each of its fit rows once per epoch;
* so a step is one gather (G, B, D) and one product with the stacked weights (G, S*K, D) for
  every seed, and one more for the gradients; the standardisation of each (layer,
  seed) (its fit rows' mean and population std) is folded into the weights as in
  :mod:`~epochlens.probes.batched`; Adam (torch's update) per probe; early stopping per probe on
  its seed's held-out rows, a stopped probe keeping its best weights, a layer whose seeds have all
  stopped dropping out (its stopped seeds' weights go on moving while one of its seeds trains, but
  only their best weights are kept). The early-stopping rows of a group of layers are gathered
  once (:func:`layers_per_fit` bounds the group's memory), each seed's scored by its own probes.

Seeds then differ by their early-stopping split only, not by their batch order: the spread over
seeds is that of the splits. The probes are not step for step those of ``per_seed`` (other
batches), but reach the same accuracies (tested within 0.01 on average). On CUDA with
``mixed_precision`` the two products run in bfloat16 under autocast, accumulated in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from epochlens.errors import ProbeError
from epochlens.probes.fits import BETAS, EPS, BatchedFit, SeedSplit, _adam
from epochlens.probes.settings import ProbeSettings

#: Most bytes of a fit's gathered rows: each layer's mini-batch and every seed's early-stopping
#: rows (B + S x n_stop rows of D floats) held at once (:func:`layers_per_fit`).
FIT_BYTES = 128 << 20
#: Most bytes of evaluation rows gathered at once.
EVAL_BYTES = 16 << 20


@dataclass
class _Rows:
    """The rows the seeds share: the union of their fit rows, who fits on each, and the rows of a
    shared batch: ``batch_size`` x M / (the seeds' mean number of fit rows), so that a seed has
    ``batch_size`` of its own rows in a batch on average and as many steps per epoch as alone."""

    fit: torch.Tensor  # (M,) global rows, ascending: the union of the seeds' fit rows
    fit_weight: torch.Tensor  # (M, S) float: 1 where the row is the seed's fit row
    batch: int

    @classmethod
    def of(cls, splits: Sequence[SeedSplit], batch_size: int = 1) -> _Rows:
        fit = torch.unique(torch.cat([sp.fit for sp in splits]))
        weight = torch.stack([torch.isin(fit, sp.fit) for sp in splits], 1).float()
        own = sum(len(sp.fit) for sp in splits) / len(splits)
        return cls(fit, weight, max(1, round(batch_size * len(fit) / own)))


def layers_per_fit(splits: Sequence[SeedSplit], batch_size: int, width: int) -> int:
    """How many layers of ``width`` features one shared fit takes: their mini-batch and every
    seed's early-stopping rows within :data:`FIT_BYTES` (at least one layer)."""
    batch, stop = _Rows.of(splits, batch_size).batch, sum(len(sp.stop) for sp in splits)
    return max(1, FIT_BYTES // ((batch + stop) * width * 4))


class _Scratch:
    """One block of memory that gathered rows reuse: a fresh tensor of many MiB per gather costs
    its page faults each time (2-6x the copy itself, measured on the CPU)."""

    def __init__(self) -> None:
        self.block: torch.Tensor | None = None

    def gather(self, x: torch.Tensor, layers: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(Ga, R, D) features of ``rows`` in ``layers`` of ``x`` (G, N, D), valid until the next
        gather."""
        size = len(layers) * len(rows) * x.shape[2]
        if self.block is None or self.block.numel() < size or self.block.device != x.device:
            self.block = torch.empty(size, dtype=x.dtype, device=x.device)
        out = self.block[:size].view(len(layers), len(rows), x.shape[2])
        if len(layers) == x.shape[0]:
            return torch.index_select(x, 1, rows, out=out)
        for i, layer in enumerate(layers.tolist()):
            torch.index_select(x[layer], 0, rows, out=out[i])
        return out


class _StopRows:
    """Every seed's early-stopping rows, one seed after the other: their features (G, T, D),
    gathered once (after a layer drops out, those of the layers still training, once), targets
    (T,) and each seed's (start, end)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, splits: Sequence[SeedSplit]) -> None:
        rows = torch.cat([sp.stop for sp in splits])
        self.x, self.y = x.index_select(1, rows), y[rows]
        ends = torch.tensor([len(sp.stop) for sp in splits]).cumsum(0).tolist()
        self.bounds = list(zip([0, *ends[:-1]], ends, strict=True))
        self.layers = torch.arange(x.shape[0], device=x.device)
        self.of_layers = self.x

    def features(self, layers: torch.Tensor) -> torch.Tensor:
        if len(layers) != len(self.layers) or not torch.equal(layers, self.layers):
            self.layers, self.of_layers = layers, self.x.index_select(0, layers)
        return self.of_layers


@dataclass
class _Probes:
    """Weights (G, S, K, D), biases (G, S, K), their Adam moments, the best of each probe; each
    seed's Adam step count (S,) on the CPU (``even`` while they are all equal); ``mean`` and the
    reciprocal ``inv_scale`` (G, S, 1, D) of the features."""

    w: torch.Tensor
    b: torch.Tensor
    m_w: torch.Tensor
    v_w: torch.Tensor
    m_b: torch.Tensor
    v_b: torch.Tensor
    best_w: torch.Tensor
    best_b: torch.Tensor
    mean: torch.Tensor
    inv_scale: torch.Tensor
    steps: torch.Tensor
    even: bool = True

    @classmethod
    def zeros(cls, mean: torch.Tensor, scale: torch.Tensor, k: int) -> _Probes:
        g, s, _, d = mean.shape
        w = [torch.zeros(g, s, k, d, device=mean.device) for _ in range(4)]
        b = [torch.zeros(g, s, k, device=mean.device) for _ in range(4)]
        steps = torch.zeros(s, dtype=torch.long)
        return cls(w[0], b[0], w[1], w[2], b[1], b[2], w[3], b[3], mean, 1 / scale, steps)

    def state(self, layers: torch.Tensor | None) -> list[torch.Tensor]:
        """w, b, m_w, v_w, m_b, v_b, mean, inv_scale of ``layers`` (None: all, not copied)."""
        every = (self.w, self.b, self.m_w, self.v_w, self.m_b, self.v_b, self.mean, self.inv_scale)
        return list(every) if layers is None else [t[layers] for t in every]


def _fold(w, b, mean, inv_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (G, D, S*K) (a transposed view) and biases (G, 1, S*K) of raw features for
    standardised ones (w (G, S, K, D), b (G, S, K), mean and 1 / scale (G, S, 1, D)):
    x (w / scale) + b - (mean / scale) w."""
    ws = w * inv_scale
    bias = b - (ws * mean).sum(3)
    return ws.flatten(1, 2).transpose(1, 2), bias.flatten(1)[:, None, :]


#: Largest squared distance (in variances) of a seed's mean from the union's for float32 sums:
#: beyond, a layer's statistics are summed in float64 (the float32 variance would lose digits).
FLOAT32_SHIFT = 100.0


def fit_stats(x: torch.Tensor, rows: _Rows, standardize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, S, 1, D) mean and population std (1 where 0) of each (layer, seed)'s fit rows, a layer
    at a time: sums of the features less the mean of the union of the fit rows, weighted per seed,
    in float32 (within 1e-5 of float64 two-pass statistics, relative to the std), or in float64
    where a seed's mean lies far from the union's (:data:`FLOAT32_SHIFT`)."""
    g, _, d = x.shape
    s = rows.fit_weight.shape[1]
    if not standardize:
        ones = torch.ones(g, s, 1, d, device=x.device)
        return torch.zeros_like(ones), ones
    weight = rows.fit_weight.T.contiguous()  # (S, M)
    means, scales = [], []
    for layer in range(g):
        mean, var, shift = _weighted_moments(x[layer].index_select(0, rows.fit).float(), weight)
        if not bool((shift.square() <= FLOAT32_SHIFT * var).all()):
            xs = x[layer].index_select(0, rows.fit).double()
            mean, var = (t.float() for t in _weighted_moments(xs, weight.double())[:2])
        std = var.sqrt()
        means.append(mean)
        scales.append(torch.where(std > 0, std, torch.ones_like(std)))
    return torch.stack(means)[:, :, None], torch.stack(scales)[:, :, None]


def _weighted_moments(xs: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(S, D) mean, population variance and mean less the rows' mean of rows ``xs`` (M, D)
    weighted by ``weight`` (S, M) (0 or 1), from the rows less their mean (``xs`` is overwritten)."""
    count = weight.sum(1, keepdim=True)
    centre = xs.mean(0)
    xs -= centre
    shift = (weight @ xs) / count  # the seed's mean less the centre
    var = ((weight @ xs.square_()) / count - shift.square()).clamp_(min=0)
    return centre + shift, var, shift


def stop_losses(stop: _StopRows, probes: _Probes, layers: torch.Tensor, amp: bool) -> torch.Tensor:
    """(Ga, S) mean cross-entropy of each probe of ``layers`` (Ga,) on its seed's early-stopping
    rows: one product per seed of its rows with its probes' weights."""
    w, b, *_, mean, inv_scale = probes.state(layers)
    ws, bias = _fold(w, b, mean, inv_scale)
    xs, k = stop.features(layers), w.shape[2]
    out = []
    for seed, (lo, hi) in enumerate(stop.bounds):
        cols = slice(seed * k, (seed + 1) * k)
        z = _logits(xs[:, lo:hi], ws[:, :, cols], bias[:, :, cols], amp)  # (Ga, n_stop, K)
        target = stop.y[lo:hi][None, :, None].expand(len(layers), -1, 1)
        out.append((_logsumexp(z) - z.gather(2, target)[..., 0]).mean(1))
    return torch.stack(out, 1)


def _logsumexp(z: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(z))) over the last dimension, written out (torch.logsumexp over ~10 classes
    took several times as long on the CPU)."""
    top = z.amax(-1, keepdim=True)
    return (z - top).exp_().sum(-1).log_() + top[..., 0]


def _logits(xb: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor, amp: bool) -> torch.Tensor:
    with torch.autocast(device_type=xb.device.type, dtype=torch.bfloat16, enabled=amp):
        z = torch.bmm(xb, ws)
    return z.float() + bias


def train_shared(
    x: torch.Tensor,
    y: torch.Tensor,
    splits: Sequence[SeedSplit],
    seeds: Sequence[int],
    n_classes: int,
    settings: ProbeSettings,
    amp: bool = False,
) -> BatchedFit:
    """Fit the probes of every layer of ``x`` (G, N, D) and every seed on shared mini-batches
    (module doc); ``y``: (N,) int64 targets, defined on every fit and stop row; ``splits[s]``:
    seed ``seeds[s]``'s rows. The probes are returned layer-major (probe = layer * S + seed)."""
    g, s = x.shape[0], len(splits)
    rows = _Rows.of(splits, settings.batch_size)
    stop, scratch = _StopRows(x, y, splits), _Scratch()
    probes = _Probes.zeros(*fit_stats(x, rows, settings.standardize), n_classes)
    gen = torch.Generator(device="cpu").manual_seed(int(seeds[0]))
    training = torch.ones(g, s, dtype=torch.bool, device=x.device)  # not stopped yet
    best = stop_losses(stop, probes, torch.arange(g, device=x.device), amp)
    best_epoch = torch.zeros(g, s, dtype=torch.long, device=x.device)
    since = torch.zeros(g, s, dtype=torch.long, device=x.device)
    epochs_run = torch.full((g, s), settings.max_epochs, dtype=torch.long, device=x.device)
    for epoch in range(1, settings.max_epochs + 1):
        layers = torch.nonzero(training.any(1)).flatten()
        order = torch.randperm(len(rows.fit), generator=gen).to(x.device)
        _epoch(x, y, rows, order, probes, layers, settings, amp, scratch)
        current = stop_losses(stop, probes, layers, amp)
        on = training[layers]
        if not torch.isfinite(current[on]).all():
            raise ProbeError(
                f"probe loss became non-finite at epoch {epoch}: features with extreme values. Keep "
                "standardize on or lower lr."
            )
        improved = on & (current < best[layers] - settings.min_delta)
        best[layers] = torch.where(improved, current, best[layers])
        _keep_best(probes, layers, improved)
        best_epoch[layers] = torch.where(improved, epoch, best_epoch[layers])
        since[layers] = torch.where(improved, 0, since[layers] + 1)
        done = on & (since[layers] >= settings.patience)
        epochs_run[layers] = torch.where(done, epoch, epochs_run[layers])
        training[layers] = on & ~done
        if not training.any():
            break
    weight = probes.best_w.flatten(0, 1).transpose(1, 2)  # (P, D, K)
    mean, scale = (t.flatten(0, 2).reshape(g * s, -1) for t in (probes.mean, 1 / probes.inv_scale))
    return BatchedFit(
        weight, probes.best_b.flatten(0, 1), mean, scale,
        best_epoch.flatten().tolist(), epochs_run.flatten().tolist(),
    )  # fmt: skip


def _keep_best(probes: _Probes, layers: torch.Tensor, improved: torch.Tensor) -> None:
    """The current weights of the improved probes ((Ga, S) of ``layers``) become their best."""
    mask = improved[:, :, None]  # (Ga, S, 1)
    probes.best_w[layers] = torch.where(mask[..., None], probes.w[layers], probes.best_w[layers])
    probes.best_b[layers] = torch.where(mask, probes.b[layers], probes.best_b[layers])


def _epoch(x, y, rows: _Rows, order, probes: _Probes, layers, settings, amp, scratch: _Scratch) -> None:
    """One pass of the probes of ``layers`` over the shared batches of ``order`` (positions in
    ``rows.fit``)."""
    every = len(layers) == x.shape[0]
    state = probes.state(None if every else layers)
    w, b, m_w, v_w, m_b, v_b, mean, inv_scale = state
    s = w.shape[1]
    for lo in range(0, len(order), rows.batch):
        pos = order[lo : lo + rows.batch]
        r = rows.fit[pos]
        xb = scratch.gather(x, layers, r)  # (Ga, B, D)
        weight = rows.fit_weight[pos]  # (B, S)
        count = weight.sum(0)
        z = _logits(xb, *_fold(w, b, mean, inv_scale), amp).unflatten(2, (s, -1))  # (Ga, B, S, K)
        # softmax written out (torch.softmax over a last dimension of ~10 is slow on the CPU)
        grad_z = (z - z.amax(3, keepdim=True)).exp_()
        grad_z /= grad_z.sum(3, keepdim=True)
        grad_z[:, torch.arange(len(r), device=x.device), :, y[r]] -= 1.0
        grad_z *= (weight / count.clamp(min=1))[:, :, None]  # a seed's mean over its rows of the batch
        with torch.autocast(device_type=xb.device.type, dtype=torch.bfloat16, enabled=amp):
            xg = torch.bmm(grad_z.flatten(2).transpose(1, 2), xb)  # (Ga, S*K, D)
        col = grad_z.sum(1)  # (Ga, S, K)
        g_w = torch.addcmul(xg.float().unflatten(1, (s, -1)), col[..., None], mean, value=-1).mul_(inv_scale)
        if settings.weight_decay:
            g_w.add_(w, alpha=settings.weight_decay)
        _adam_seeds(probes, count.cpu() > 0, [(w, g_w, m_w, v_w), (b, col, m_b, v_b)], settings.lr)
    if not every:
        for whole, part in zip(probes.state(None)[:6], state[:6], strict=True):
            whole[layers] = part


def _adam_seeds(probes: _Probes, on: torch.Tensor, groups, lr: float) -> None:
    """An Adam step of each (param, grad, m, v) of ``groups`` (tensors (G, S, ...)) for the seeds
    ``on`` (S,) (a batch without a row of a seed is no step for it): torch's update
    (:func:`epochlens.probes.batched._adam`) while every seed has had every step, else per seed."""
    probes.steps += on
    probes.even = probes.even and bool(on.all())
    if probes.even:
        step = int(probes.steps[0])
        for param, grad, m, v in groups:
            _adam(param, grad, m, v, step, lr)
        return
    b1, b2 = BETAS
    t = probes.steps.clamp(min=1).double()
    device = groups[0][0].device
    root = (1 - b2**t).sqrt().float().to(device)  # (S,)
    size = (lr / (1 - b1**t)).float().to(device)
    for param, grad, m, v in groups:
        shape = (1, -1) + (1,) * (param.dim() - 2)  # (1, S, 1, ...)
        mask = on.to(device).view(shape)
        before = (param.clone(), m.clone(), v.clone())
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        param.sub_(m / (v.sqrt() / root.view(shape)).add_(EPS) * size.view(shape))
        for now, old in zip((param, m, v), before, strict=True):
            now.copy_(torch.where(mask, now, old))


def shared_rows(
    x: torch.Tensor, y: torch.Tensor, splits: Sequence[SeedSplit], plan, settings, amp
) -> list[list[dict]]:
    """The probes of each layer of ``x`` (G, N, D) fitted on shared batches: per layer, its rows
    (seed, evaluation set) as :func:`epochlens.probes.batched.batched_rows` gives them, scored for
    all seeds of a layer at once (one product per block of rows with the folded weights)."""
    fit = train_shared(x, y, splits, settings.seeds, plan.n_classes, settings, amp)
    s, d = len(settings.seeds), x.shape[2]
    fit_rows = _Rows.of([SeedSplit(f, f) for f, _ in plan.seed_rows])
    scratch = _Scratch()
    out = []
    for layer in range(x.shape[0]):
        p = slice(layer * s, (layer + 1) * s)
        ws = fit.weight[p] / fit.scale[p][:, :, None]  # (S, D, K)
        bias = fit.bias[p] - torch.einsum("sd,sdk->sk", fit.mean[p], ws)
        folded = (ws.permute(1, 0, 2).reshape(d, -1), bias.reshape(-1))
        where = (x, torch.tensor([layer], device=x.device), y, scratch)
        correct, _ = _scores(where, fit_rows.fit, folded, s)
        fit_acc = (correct * fit_rows.fit_weight).sum(0) / fit_rows.fit_weight.sum(0)
        scores = {name: _scores(where, ev, folded, s) for name, ev in plan.eval_sets.items()}
        rows = []
        for i, seed in enumerate(settings.seeds):
            n_fit, n_stop = (len(r) for r in plan.seed_rows[i])
            for name, (right, nll) in scores.items():
                acc, loss = float(right[:, i].mean()), float(nll[:, i].mean())
                row = plan.row(seed, name, d, n_fit, n_stop, len(right), acc, loss, float(fit_acc[i]))
                rows.append(row | {"best_epoch": fit.best_epoch[p][i], "epochs_run": fit.epochs_run[p][i]})
        out.append(rows)
    return out


def _scores(where, rows: torch.Tensor, folded, s: int):
    """(R, S) float 1 where seed's probe is right on a row of ``rows``, and its cross-entropy, for
    ``where`` = (x (G, N, D), the layer (1,), y (N,), scratch), folded weights (D, S*K) and biases
    (S*K,), a block of rows at a time."""
    x, layer, y, scratch = where
    weight, bias = folded
    chunk = max(1, EVAL_BYTES // (x.shape[2] * 4))
    right, nll = [], []
    for lo in range(0, len(rows), chunk):
        r = rows[lo : lo + chunk]
        z = torch.addmm(bias, scratch.gather(x, layer, r)[0], weight).unflatten(1, (s, -1))  # (R, S, K)
        target = y[r][:, None, None].expand(-1, s, 1)
        right.append((z.argmax(2, keepdim=True) == target)[..., 0].float())
        nll.append(_logsumexp(z) - z.gather(2, target)[..., 0])
    return torch.cat(right), torch.cat(nll)
