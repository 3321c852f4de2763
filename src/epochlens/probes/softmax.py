"""The softmax probe of one (layer, representation, target), one seed at a time: a softmax
regression (one linear layer) on standardised features, trained with Adam on mini-batches and
stopped early on a per-seed subset of the fit samples (:func:`probe_seeds`). Everything stays on one
device: the features move there once, mini-batches are index slices of the resident tensor (no
DataLoader, no workers). On CUDA the forward pass runs under autocast (bfloat16 where the GPU
supports it, else float16 with a gradient scaler); on the CPU and MPS it is float32.

Seeds change the early-stopping subset and the mini-batch order (weights start at zero: the
problem is convex, so the solution does not depend on an initialisation). Which features, targets
and splits are probed: :mod:`epochlens.probes.linear`; the seeds or layers fitted together as
batched tensor operations: :mod:`epochlens.probes.batched`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from epochlens.device import resolve_device
from epochlens.errors import ProbeError
from epochlens.probes.plan import probe_plan
from epochlens.probes.settings import ProbeSettings


@dataclass
class ProbeFit:
    """A trained probe: logits = ((x - mean) / scale) @ weight + bias."""

    weight: torch.Tensor  # (D, K)
    bias: torch.Tensor  # (K,)
    mean: torch.Tensor  # (D,)
    scale: torch.Tensor  # (D,)
    best_epoch: int  # epoch (1-based) whose weights were kept
    epochs_run: int

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(N, K) float32 logits of features (N, D) on the probe's device."""
        return ((x.float() - self.mean) / self.scale) @ self.weight + self.bias

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 8192) -> tuple[float, float]:
        """(accuracy, mean cross-entropy in nats) on features (N, D) and targets (N,)."""
        if len(y) == 0:
            return math.nan, math.nan
        correct, loss = 0.0, 0.0
        for lo in range(0, len(y), batch_size):
            logits = self.logits(x[lo : lo + batch_size])
            yb = y[lo : lo + batch_size]
            correct += float((logits.argmax(1) == yb).sum())
            loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        return correct / len(y), loss / len(y)


def amp_mode(device: torch.device, enabled: bool) -> tuple[bool, torch.dtype]:
    if not enabled or device.type != "cuda":
        return False, torch.float32
    return True, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def train_linear_probe(
    x_fit: torch.Tensor,
    y_fit: torch.Tensor,
    x_stop: torch.Tensor | None,
    y_stop: torch.Tensor | None,
    n_classes: int,
    settings: ProbeSettings,
    seed: int,
) -> ProbeFit:
    """Train a softmax-regression probe on the device of ``x_fit``.

    Args:
        x_fit, y_fit: (N, D) features and (N,) int64 targets in 0 .. n_classes-1.
        x_stop, y_stop: early-stopping samples (None or empty: stop on the fit loss instead).
        n_classes: number of outputs K.
        settings: optimiser and early-stopping settings.
        seed: seed of the mini-batch order.

    Returns:
        The :class:`ProbeFit` of the epoch with the lowest early-stopping loss.
    """
    with cpu_threads(x_fit.device, settings.cpu_threads):
        return _train(x_fit, y_fit, x_stop, y_stop, n_classes, settings, seed)


@contextmanager
def cpu_threads(device: torch.device, n: int | None) -> Iterator[None]:
    """Inside the block, torch uses ``n`` intra-op threads if ``device`` is the CPU (then restores)."""
    if device.type != "cpu" or n is None or n == torch.get_num_threads():
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _train(
    x_fit: torch.Tensor,
    y_fit: torch.Tensor,
    x_stop: torch.Tensor | None,
    y_stop: torch.Tensor | None,
    n_classes: int,
    settings: ProbeSettings,
    seed: int,
) -> ProbeFit:
    device = x_fit.device
    n, d = x_fit.shape
    if n < 1:
        raise ProbeError("no samples to fit the probe on")
    x_fit = x_fit.float()
    mean = x_fit.mean(0) if settings.standardize else torch.zeros(d, device=device)
    scale = x_fit.std(0, correction=0) if settings.standardize else torch.ones(d, device=device)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if x_stop is None or y_stop is None or len(y_stop) == 0:
        x_stop, y_stop = x_fit, y_fit
    xs_fit = (x_fit - mean) / scale  # standardised once; batches are index slices
    xs_stop = (x_stop.float() - mean) / scale
    weight = torch.zeros(d, n_classes, device=device, requires_grad=True)
    bias = torch.zeros(n_classes, device=device, requires_grad=True)
    opt = torch.optim.Adam([weight, bias], lr=settings.lr)
    use_amp, amp_dtype = amp_mode(device, settings.mixed_precision)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def stop_loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(xs_stop @ weight + bias, y_stop))

    best = (stop_loss(), weight.detach().clone(), bias.detach().clone(), 0)
    since_best, epoch = 0, 0
    for epoch in range(1, settings.max_epochs + 1):
        order = torch.randperm(n, generator=gen).to(device)
        for lo in range(0, n, settings.batch_size):
            idx = order[lo : lo + settings.batch_size]
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
                logits = xs_fit[idx] @ weight + bias
            loss = F.cross_entropy(logits.float(), y_fit[idx])
            if settings.weight_decay:
                loss = loss + 0.5 * settings.weight_decay * weight.square().sum()
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        current = stop_loss()
        if not math.isfinite(current):
            raise ProbeError(
                f"probe loss became {current} at epoch {epoch}: features with extreme values. Keep "
                "standardize on or lower lr."
            )
        if current < best[0] - settings.min_delta:
            best = (current, weight.detach().clone(), bias.detach().clone(), epoch)
            since_best = 0
        else:
            since_best += 1
            if since_best >= settings.patience:
                break
    return ProbeFit(best[1], best[2], mean, scale, best[3], epoch)


def probe_seeds(
    x: torch.Tensor | np.ndarray,
    y: np.ndarray,
    fit_mask: np.ndarray,
    eval_masks: Mapping[str, np.ndarray],
    settings: ProbeSettings | None = None,
    device: torch.device | str | None = None,
) -> list[dict]:
    """Train one probe per seed and evaluate it: rows of seed, eval_split and the metrics
    (``settings.batch_order`` ``shared``: the seeds on shared mini-batches,
    :mod:`epochlens.probes.shared_order`).

    Args:
        x: (N, D) features of every sample (moved to ``device`` once).
        y: (N,) int64 targets, -1 where undefined (left out everywhere).
        fit_mask: (N,) bool, the samples to fit (and to draw the early-stopping subset from).
        eval_masks: name -> (N,) bool, the evaluation sets (e.g. holdout, test).
        settings: probe settings.
        device: "auto", "cpu", "cuda", ...; None: the device of ``x`` if a tensor, else "auto".

    Returns:
        One dict per (seed, evaluation set) with keys seed, eval_split, n_features, n_classes,
        n_fit, n_stop, n_eval, accuracy, loss, chance, fit_accuracy, best_epoch, epochs_run and
        metric ("accuracy").
    """
    settings = settings or ProbeSettings()
    y = np.asarray(y, dtype=np.int64)
    if x.shape[0] != len(y) or len(fit_mask) != len(y) or any(len(m) != len(y) for m in eval_masks.values()):
        raise ProbeError(
            f"features ({x.shape[0]} rows), targets ({len(y)}), fit mask ({len(fit_mask)}) and "
            "evaluation masks must all have one entry per sample"
        )
    if device is None:
        device = x.device if isinstance(x, torch.Tensor) else "auto"
    device = resolve_device(device) if isinstance(device, str) else torch.device(device)
    x_dev = torch.as_tensor(x).to(device)
    if settings.batch_order == "shared":  # the seeds on shared mini-batches, as a layer of many
        from epochlens.probes.batched import batched_rows

        amp, _ = amp_mode(device, settings.mixed_precision)
        with cpu_threads(device, settings.batched_threads):
            rows = batched_rows(x_dev[None].float(), y, fit_mask, eval_masks, settings, amp)[0]
        return [row | {"metric": "accuracy"} for row in rows]
    plan = probe_plan(y, fit_mask, eval_masks, settings, device)
    y_dev = torch.as_tensor(y).to(device)
    rows = []
    with cpu_threads(device, settings.cpu_threads):
        for seed, (fit_idx, stop_idx) in zip(settings.seeds, plan.seed_rows, strict=True):
            probe = train_linear_probe(
                x_dev[fit_idx],
                y_dev[fit_idx],
                x_dev[stop_idx],
                y_dev[stop_idx],
                plan.n_classes,
                settings,
                seed,
            )
            fit_acc, _ = probe.evaluate(x_dev[fit_idx], y_dev[fit_idx])
            for name, ev in plan.eval_sets.items():
                acc, loss = probe.evaluate(x_dev[ev], y_dev[ev])
                row = plan.row(
                    seed, name, int(x.shape[1]), len(fit_idx), len(stop_idx), len(ev), acc, loss, fit_acc
                )
                rows.append(row | {"best_epoch": probe.best_epoch, "epochs_run": probe.epochs_run})
    return [row | {"metric": "accuracy"} for row in rows]
