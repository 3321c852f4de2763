"""Inputs as users have them: Datasets and DataLoaders with tensor, tuple or dict batches, model outputs
that are tuples, dicts or ModelOutputs, and the shared batch helpers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from exact_influence import MLP, TinyCNN, data
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from epochlens.batches import num_samples, sample_source, select_rows, to_device
from epochlens.errors import DataError
from epochlens.influence import (
    InfluenceSettings,
    factor_cache_key,
    fit_factors,
    pairwise_influence,
    self_influence,
)
from epochlens.tasks import ClassificationTask

ACTIVE = np.array([0, 2, 3])


class DictItems(Dataset):
    """Items {"pixels": x, "labels": y}: a Hugging Face style dict batch after collation."""

    def __init__(self, x: torch.Tensor, y: np.ndarray) -> None:
        self.x, self.y = x, torch.as_tensor(y)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"pixels": self.x[i], "labels": self.y[i]}


class DictInput(nn.Module):
    """forward(pixels=...) returning a dict; the logits under "scores"."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, pixels: torch.Tensor) -> dict:
        return {"features": None, "scores": self.inner(pixels)}


class TupleOutput(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> tuple:
        z = self.inner(x)
        return z, z.detach().argmax(1)


def _run(model, train, query, labels=(None, None), task=None, active=ACTIVE):
    settings = InfluenceSettings(
        method="ekfac", factor_batch_size=4, train_batch_size=5, query_batch_size=3, damping=1e-3
    )
    kw = {"task": task} if task is not None else {"active_classes": active}
    factors = fit_factors(model, train, labels[0], settings=settings, **kw)
    pair = pairwise_influence(model, factors, train, labels[0], query, labels[1], settings=settings, **kw)
    selfs = self_influence(model, factors, train, labels[0], settings=settings, **kw)
    return pair, selfs


def test_datasets_loaders_and_dict_batches_give_the_in_memory_scores() -> None:
    """TensorDataset, a DataLoader, dict items and a dict-input model with a dict output: same scores.

    Three of four classes are active: samples of class 1 are not scored (NaN) in every form, and
    the batches of a dataset keep their other samples.
    """
    torch.manual_seed(70)
    inner = TinyCNN(c=4).double().eval()
    x, y = data(14, (2, 5, 5), 4, 70)
    ref_pair, ref_self = _run(inner, x, x[:5], (y, y[:5]))
    assert np.isnan(ref_self.scores[y == 1]).all() and np.isfinite(ref_self.scores[y != 1]).all()
    forms = {
        "TensorDataset": (
            inner,
            TensorDataset(x, torch.as_tensor(y)),
            TensorDataset(x[:5], torch.as_tensor(y[:5])),
        ),
        "DataLoader": (
            inner,
            DataLoader(TensorDataset(x, torch.as_tensor(y)), batch_size=4),
            DataLoader(TensorDataset(x[:5], torch.as_tensor(y[:5])), batch_size=2),
        ),
        "dict": (DictInput(inner), DictItems(x, y), DictItems(x[:5], y[:5])),
    }
    for name, (model, train, query) in forms.items():
        task = ClassificationTask(ACTIVE, output="scores") if name == "dict" else ClassificationTask(ACTIVE)
        pair, selfs = _run(model, train, query, task=task)
        np.testing.assert_allclose(pair.scores, ref_pair.scores, rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(selfs.scores, ref_self.scores, rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(selfs.losses, ref_self.losses, rtol=1e-12, err_msg=name)


def test_tuple_outputs_and_model_output_objects() -> None:
    torch.manual_seed(71)
    inner = MLP(3, 5, 4).double().eval()
    x, y = data(10, (3,), 4, 71)
    ref = _run(inner, x, x[:3], (y, y[:3]))[1].scores
    got = _run(TupleOutput(inner), x, x[:3], (y, y[:3]))[1].scores
    np.testing.assert_array_equal(got, ref)
    transformers = pytest.importorskip("transformers")

    class HFStyle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return transformers.modeling_outputs.SequenceClassifierOutput(logits=self.inner(x))

    np.testing.assert_array_equal(_run(HFStyle(), x, x[:3], (y, y[:3]))[1].scores, ref)


def test_true_fisher_draws_follow_the_global_index_through_a_subset() -> None:
    """A Subset with its indices gives the factors of the in-memory rows with the same sample_indices."""
    torch.manual_seed(72)
    m = MLP(3, 5, 4).double().eval()
    x, y = data(20, (3,), 4, 72)
    keep = np.array([1, 4, 5, 9, 12, 13, 17, 19])
    settings = InfluenceSettings(method="kfac", fisher="true", factor_batch_size=3)
    ref = fit_factors(m, x[keep], y[keep], np.arange(4), settings, sample_indices=keep)
    sub = Subset(TensorDataset(x, torch.as_tensor(y)), keep.tolist())
    got = fit_factors(m, sub, None, np.arange(4), settings, sample_indices=keep)
    torch.testing.assert_close(
        got.layers["fc2"].gradient_cov, ref.layers["fc2"].gradient_cov, rtol=1e-12, atol=0
    )
    other = fit_factors(m, sub, None, np.arange(4), settings)  # indices 0..7: other draws
    assert not torch.allclose(other.layers["fc2"].gradient_cov, ref.layers["fc2"].gradient_cov)


def test_bad_data_is_refused_with_the_fix() -> None:
    m = MLP(3, 5, 4).double().eval()
    x, y = data(8, (3,), 4, 73)
    ds = TensorDataset(x, torch.as_tensor(y))
    with pytest.raises(DataError, match="labels were given beside a Dataset"):
        fit_factors(m, ds, y, np.arange(4))
    shuffled = DataLoader(ds, batch_size=3, shuffle=True)
    with pytest.raises(DataError, match="RandomSampler.*shuffle=False"):
        self_influence(m, None, shuffled, None, np.arange(4), InfluenceSettings(method="identity"))
    with pytest.raises(DataError, match="5 sample indices for 8 samples"):
        fit_factors(m, ds, None, np.arange(4), sample_indices=np.arange(5))
    with pytest.raises(DataError, match="in-memory inputs must be one array"):
        self_influence(m, None, {"x": x}, y, np.arange(4), InfluenceSettings(method="identity"))
    with pytest.raises(ValueError, match="labels must be a 1-D integer array"):
        fit_factors(m, x, y.astype(float), np.arange(4))


def test_factor_cache_key_of_a_dataset_follows_its_content_and_the_task() -> None:
    m = MLP(3, 5, 4).double().eval()
    x, y = data(8, (3,), 4, 74)
    settings = InfluenceSettings()
    ds = TensorDataset(x, torch.as_tensor(y))
    key = factor_cache_key(m, ds, None, np.arange(4), settings)
    assert key == factor_cache_key(
        m, TensorDataset(x.clone(), torch.as_tensor(y)), None, np.arange(4), settings
    )
    y2 = y.copy()
    y2[0] = (y2[0] + 1) % 4
    assert (
        key["data"]
        != factor_cache_key(m, TensorDataset(x, torch.as_tensor(y2)), None, np.arange(4), settings)["data"]
    )
    # Classification over the active classes keeps today's key (no "task" entry); other tasks add theirs.
    assert "task" not in factor_cache_key(m, x, y, np.arange(4), settings)
    key_r = factor_cache_key(
        m, x, y.astype(np.float64)[:, None].repeat(4, 1), None, settings, task="regression"
    )
    assert key_r["task"] == {"name": "regression", "output": "logits", "reduction": "mean"}
    assert factor_cache_key(m, ds, None, np.arange(4), settings, data_hash="abc")["data"] == "abc"
    unlabelled = factor_cache_key(m, x, None, np.arange(4), settings)  # the true Fisher needs no labels
    assert unlabelled["data"] not in (key["data"], factor_cache_key(m, x, y, np.arange(4), settings)["data"])


def test_batch_helpers_move_nested_batches_and_cast_only_floating_tensors() -> None:
    batch = (
        {"input_ids": torch.arange(6).view(2, 3), "mask": torch.ones(2, 3, dtype=torch.bool)},
        torch.zeros(2),
    )
    moved = to_device(batch, "cpu", torch.float16)
    assert moved[0]["input_ids"].dtype == torch.int64 and moved[0]["mask"].dtype == torch.bool
    assert moved[1].dtype == torch.float16 and num_samples(moved) == 2
    one = select_rows(moved, torch.tensor([False, True]))
    assert one[0]["input_ids"].tolist() == [[3, 4, 5]] and num_samples(one) == 1
    with pytest.raises(DataError, match=r"first dimensions \[2, 3\]"):
        num_samples((torch.zeros(2), torch.zeros(3)))
    src = sample_source(np.zeros((5, 2), np.float32), np.arange(5))
    assert [len(p) for p, _ in src.batches(2)] == [2, 2, 1]


def test_the_true_fisher_fits_on_unlabelled_inputs() -> None:
    """The true Fisher draws its targets from the model: labels are not needed (nor read)."""
    torch.manual_seed(75)
    m = MLP(3, 5, 4).double().eval()
    x, y = data(9, (3,), 4, 75)
    settings = InfluenceSettings(method="ekfac", fisher="true")
    labelled = fit_factors(m, x, y, np.arange(4), settings)
    unlabelled = fit_factors(m, x, None, np.arange(4), settings)
    for name in ("fc1", "fc2"):
        torch.testing.assert_close(
            unlabelled.layers[name].corrected, labelled.layers[name].corrected, rtol=0, atol=0
        )
