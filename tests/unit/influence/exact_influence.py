"""Exact influence from explicit matrices on tiny float64 models: the ground truth of the influence
tests of this folder: classification quantities and, for any task, explicit_task_quantities.

Ground truth: with θ the tracked layers' weights and biases (each layer as its (out, in+1) gradient
matrix, bias last, flattened row-major), J_n = ∂z_n/∂θ the Jacobian of sample n's active-class
logits, p_n = softmax(z_n) and H_n = diag(p_n) − p_n p_nᵀ the cross-entropy's Hessian in z,

    GGN = 1/N Σ_n J_nᵀ H_n J_n,   g_n = J_nᵀ (p_n − e_{y_n}),
    exact pairwise[q, n] = g_qᵀ (GGN + λI)⁻¹ g_n,   exact self[n] = g_nᵀ (GGN + λI)⁻¹ g_n,

with the damping λ the engine reports per layer (block-diagonal GGN when layers differ in λ).
The "expected" Fisher is used because its expectation over labels is exactly this GGN.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import spearmanr
from torch import nn
from torch.func import functional_call, jacrev, vmap
from torch.utils.data import Dataset

from epochlens.influence import (
    select_layers,
)
from epochlens.models.networks import positions_in
from epochlens.tasks import Task


# ---------------------------------------------------------------- explicit ground truth helpers
def explicit_quantities(
    model: nn.Module, x: torch.Tensor, y: np.ndarray, active: np.ndarray, layer_names: list[str] | None = None
) -> dict:
    """GGN (P, P), per-sample gradients (N, P), Hessian of the mean loss (P, P), layer slices.

    Parameters are the tracked layers' (out, in+1) matrices flattened row-major, in module order.
    """
    model = model.eval()
    layers = select_layers(model, tuple(layer_names or ()))
    params = {n: t.detach() for n, t in model.named_parameters()}
    buffers = {n: t.detach() for n, t in model.named_buffers()}
    slices, start, parts = {}, 0, []
    for name, info in layers.items():
        w = params[f"{name}.weight"].reshape(info.out_dim, -1)
        m = torch.cat([w, params[f"{name}.bias"][:, None]], 1) if info.has_bias else w
        parts.append(m.reshape(-1))
        slices[name] = slice(start, start + m.numel())
        start += m.numel()
    theta = torch.cat(parts)
    active_t = torch.as_tensor(active)
    targets = torch.as_tensor(positions_in(y, active))

    def logits(th: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
        p = dict(params)
        for name, info in layers.items():
            m = th[slices[name]].reshape(info.out_dim, info.in_dim)
            p[f"{name}.weight"] = m[:, : info.in_features].reshape(params[f"{name}.weight"].shape)
            if info.has_bias:
                p[f"{name}.bias"] = m[:, -1]
        out = functional_call(model, {**p, **buffers}, (xi[None],))
        return out.index_select(1, active_t)[0]  # the active classes, in order

    jac = vmap(jacrev(logits), in_dims=(None, 0))(theta, x)  # (N, A, P)
    z = vmap(logits, in_dims=(None, 0))(theta, x)
    prob = torch.softmax(z, 1)
    h_out = torch.diag_embed(prob) - prob[:, :, None] * prob[:, None, :]
    ggn = torch.einsum("nap,nab,nbq->pq", jac, h_out, jac) / len(x)
    resid = prob - torch.nn.functional.one_hot(targets, len(active)).to(prob.dtype)
    grads = torch.einsum("nap,na->np", jac, resid)

    def mean_loss(th: torch.Tensor) -> torch.Tensor:
        zz = vmap(logits, in_dims=(None, 0))(th, x)
        return torch.nn.functional.cross_entropy(zz, targets)

    hessian = torch.func.hessian(mean_loss)(theta)
    return {"ggn": ggn, "grads": grads, "hessian": hessian, "slices": slices, "prob": prob}


def exact_scores(ex: dict, dampings: dict[str, float], block_diagonal: bool = True):
    """Exact pairwise (N, N) and self (N,) influence with per-layer damping."""
    ggn = ex["ggn"].clone()
    if block_diagonal:
        mask = torch.zeros_like(ggn, dtype=torch.bool)
        for sl in ex["slices"].values():
            mask[sl, sl] = True
        ggn = torch.where(mask, ggn, torch.zeros_like(ggn))
    lam = torch.zeros(ggn.shape[0], dtype=ggn.dtype)
    for name, sl in ex["slices"].items():
        lam[sl] = dampings[name]
    solved = torch.linalg.solve(ggn + torch.diag(lam), ex["grads"].T)  # (P, N)
    pair = ex["grads"] @ solved
    return pair.numpy(), torch.diagonal(pair).numpy().copy()


def dampings_of(diagnostics) -> dict[str, float]:
    return dict(zip(diagnostics["layer"], diagnostics["damping"], strict=True))


def projected_rows(model, x, y, active, settings, projection, curvature: bool = True):
    """(rows (N, width), project_samples' result, the store's layer list) of ``projection`` (its pass's
    layout: a logra layer's blocks, or trak's one)."""
    from epochlens.influence.covariances import resolve_layers
    from epochlens.influence.projection import project_samples, projection_pass

    layout = projection_pass(projection).layout(resolve_layers(model, settings), projection)
    out = np.zeros((len(x), sum(r[3] * r[4] for r in layout)))
    result = project_samples(
        model, x, y, out, settings=settings, projection=projection, active_classes=active, curvature=curvature
    )
    return out, result, layout


def projection_errors(projection_at, dims, seeds: int = 8) -> tuple[list[float], float]:
    """Johnson-Lindenstrauss, measured: for each dimension, the relative (Frobenius) error of the
    projected gradient inner products of 30 samples of an MLP(48, 40, 10) against the exact ones,
    mean over ``seeds`` projections (``projection_at(dim, seed)``: ProjectionSettings); and the
    slope of log error against log dimension."""
    from epochlens.influence import InfluenceSettings, per_sample_gradients

    torch.manual_seed(0)
    net = MLP(48, 40, 10).double().eval()
    x, y = data(30, (48,), 10, 0)
    active, settings = np.arange(10), InfluenceSettings(method="identity")
    grads = per_sample_gradients(net, x, y, active, settings)
    g = np.concatenate([v.reshape(len(x), -1).numpy() for v in grads.values()], 1)
    exact, errors = g @ g.T, []
    for dim in dims:
        runs = []
        for seed in range(seeds):
            out, _, _ = projected_rows(net, x, y, active, settings, projection_at(dim, seed), curvature=False)
            runs.append(np.linalg.norm(out @ out.T - exact) / np.linalg.norm(exact))
        errors.append(float(np.mean(runs)))
    return errors, float(np.polyfit(np.log(dims), np.log(errors), 1)[0])


# ---------------------------------------------------------------- models
class LinearSoftmax(nn.Module):
    """z = W x + b on flattened inputs."""

    def __init__(self, d: int, c: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class ConvSoftmax(nn.Module):
    """A convolution whose kernel covers the whole image (one output position) -> logits."""

    def __init__(self, c_in: int, side: int, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c, side)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(1)


class MLP(nn.Module):
    def __init__(self, d: int, h: int, c: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class TinyCNN(nn.Module):
    """Padded, strided and dilated convolutions (with and without bias), BatchNorm, pooling, Linear."""

    def __init__(self, c: int = 5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(4, 4, (3, 2), padding=(2, 1), dilation=(2, 1))
        self.fc = nn.Linear(4, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv3(torch.relu(self.conv2(x))))
        return self.fc(x.mean((2, 3)))


def constant_output_linear(d: int, c: int, seed: int) -> LinearSoftmax:
    """W = 0, b random: every input gets the same probabilities p = softmax(b)."""
    g = torch.Generator().manual_seed(seed)
    m = LinearSoftmax(d, c).double()
    with torch.no_grad():
        m.fc.weight.zero_()
        m.fc.bias.copy_(torch.randn(c, generator=g, dtype=torch.float64))
    return m.eval()


def constant_output_mlp(d: int, seed: int) -> MLP:
    """A 2-layer MLP whose output probabilities are the same for every input (see the test doc).

    Hidden units 0-3 depend on x (ReLU patterns vary between samples; unit 3 is always dead),
    units 4-7 have zero input weights and constant pre-activations (unit 7 dead). fc2 reads only
    units 4-7, so the logits are constant. With 4 outputs.
    """
    g = torch.Generator().manual_seed(seed)
    m = MLP(d, 8, 4).double()
    with torch.no_grad():
        m.fc1.weight.zero_()
        m.fc1.weight[:4] = torch.randn(4, d, generator=g, dtype=torch.float64)
        m.fc1.bias.copy_(torch.tensor([0.1, -0.2, 0.3, -50.0, 0.5, 1.0, 1.5, -1.0], dtype=torch.float64))
        m.fc2.weight.zero_()
        m.fc2.weight[:, 4:] = torch.randn(4, 4, generator=g, dtype=torch.float64)
        m.fc2.bias.copy_(torch.randn(4, generator=g, dtype=torch.float64))
    return m.eval()


def data(n: int, shape: tuple[int, ...], classes: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    y = np.random.default_rng(seed).integers(0, classes, n)
    return x, y


def assert_matches(ours: np.ndarray, exact: np.ndarray, rtol: float = 1e-6) -> None:
    scale = np.abs(exact).max()
    np.testing.assert_allclose(ours, exact, rtol=rtol, atol=rtol * scale)
    # Rank agreement; rounded so that scores tied in exact arithmetic stay tied.
    rounded = [np.round(a.ravel() / scale, 9) for a in (ours, exact)]
    assert spearmanr(*rounded).statistic >= 0.99


# ---------------------------------------------------------------- tests


# ---------------------------------------------------------------- explicit ground truth for any task
def _single(batch, i: int):
    """Sample i of a nested batch, with a batch dimension of 1."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return torch.as_tensor(batch[i : i + 1])
    if isinstance(batch, dict):
        return {k: _single(v, i) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_single(v, i) for v in batch)
    return batch


def explicit_task_quantities(
    model: nn.Module,
    task: Task,
    inputs,
    targets,
    layer_names: tuple[str, ...] = (),
    query_inputs=None,
    query_targets=None,
) -> dict:
    """GGN (P, P), training gradients (N, P), query gradients (Q, P) and layer slices, by autograd."""
    model = model.eval()
    layers = select_layers(model, layer_names)
    params = dict(model.named_parameters())
    names = {id(p): n for n, p in params.items()}
    params = {n: p.detach() for n, p in params.items()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    slices, start, parts = {}, 0, []
    for name, info in layers.items():
        w = params[names[id(info.weight)]]
        w = w.T if info.kind == "conv1d" else w.reshape(info.out_dim, -1)
        m = torch.cat([w, params[names[id(info.module.bias)]][:, None]], 1) if info.has_bias else w
        parts.append(m.reshape(-1))
        slices[name] = slice(start, start + m.numel())
        start += m.numel()
    theta = torch.cat(parts)

    def unpack(th: torch.Tensor) -> dict:
        p = dict(params)
        for name, info in layers.items():
            m = th[slices[name]].reshape(info.out_dim, info.in_dim)
            wname = names[id(info.weight)]
            w = m[:, : info.in_features]
            p[wname] = w.T if info.kind == "conv1d" else w.reshape(params[wname].shape)
            if info.has_bias:
                p[names[id(info.module.bias)]] = m[:, -1]
        return p

    def predict(th: torch.Tensor, x):
        args = {**unpack(th), **buffers}
        if isinstance(x, dict):
            out = functional_call(model, args, (), x)
        else:
            out = functional_call(model, args, (x,))
        return task.prediction(out)

    def per_sample(x_all, y_all, measurement: bool):
        n = len(x_all["input_ids"]) if isinstance(x_all, dict) else len(x_all)
        grads, ggn = [], torch.zeros(len(theta), len(theta), dtype=torch.float64)
        for i in range(n):
            x, y = _single(x_all, i), (None if y_all is None else _single(y_all, i))
            z = predict(theta, x)
            jac = jacrev(lambda th, x=x: predict(th, x).reshape(-1))(theta)  # (D, P)

            def loss(flat, x=x, y=y, shape=z.shape):
                fn = task.measurement if measurement else task.loss
                return fn(flat.reshape(shape), y, x)[0]

            flat = z.detach().reshape(-1)
            g_z = torch.func.grad(loss)(flat)
            h_z = torch.func.hessian(loss)(flat)
            grads.append(jac.T @ g_z)
            ggn += jac.T @ h_z @ jac
        return torch.stack(grads), ggn / n

    grads, ggn = per_sample(inputs, targets, False)
    out = {"ggn": ggn, "grads": grads, "slices": slices}
    if query_inputs is not None:
        out["query_grads"], _ = per_sample(query_inputs, query_targets, True)
    return out


def exact_task_scores(
    ex: dict, dampings: dict[str, float], block_diagonal: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact pairwise (Q, N) (queries, or the training set itself), self (N,) with per-layer damping:
    the block-diagonal GGN (each tracked layer's own block, what the Kronecker methods approximate)
    or, with ``block_diagonal=False``, the full GGN with its cross-layer terms."""
    ggn = ex["ggn"].clone()
    mask = torch.zeros_like(ggn, dtype=torch.bool)
    lam = torch.zeros(ggn.shape[0], dtype=ggn.dtype)
    for name, sl in ex["slices"].items():
        mask[sl, sl] = True
        lam[sl] = dampings[name]
    if block_diagonal:
        ggn = torch.where(mask, ggn, torch.zeros_like(ggn))
    solved = torch.linalg.solve(ggn + torch.diag(lam), ex["grads"].T)  # (P, N)
    queries = ex.get("query_grads", ex["grads"])
    pair = queries @ solved
    selfs = torch.einsum("np,pn->n", ex["grads"], solved)
    return pair.numpy(), selfs.numpy(), ggn.numpy()


class DictDataset(Dataset):
    """Items {"input_ids": (T,), "attention_mask": (T,), "labels": (T,)} from padded tensors."""

    def __init__(self, batch: dict[str, torch.Tensor]) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch["input_ids"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.batch.items()}


def token_batch(
    n: int, vocab: int, seed: int, max_len: int = 6, pad: int = 0, extra_pad: int = 0
) -> dict[str, torch.Tensor]:
    """Right-padded sequences of lengths 3..max_len, the first token a prompt (label -100)."""
    rng = np.random.default_rng(seed)
    t = max_len + extra_pad
    ids = np.full((n, t), pad, dtype=np.int64)
    mask = np.zeros((n, t), dtype=np.int64)
    labels = np.full((n, t), -100, dtype=np.int64)
    for i in range(n):
        length = int(rng.integers(3, max_len + 1))
        ids[i, :length] = rng.integers(0, vocab, length)
        mask[i, :length] = 1
        labels[i, 1:length] = ids[i, 1:length]  # the first token is the prompt
    return {
        "input_ids": torch.as_tensor(ids),
        "attention_mask": torch.as_tensor(mask),
        "labels": torch.as_tensor(labels),
    }
