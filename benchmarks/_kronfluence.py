"""kronfluence's side of ``benchmarks/influence.py --kronfluence PYTHON``: run with that Python (a
virtual environment holding kronfluence 1.0.1), never imported by epochlens.

    PYTHON benchmarks/_kronfluence.py WORKDIR --threads 2 --batch-size 32 --query-batch-size 50

WORKDIR holds ``inputs.pt`` (written by the benchmark: model name, state_dict, training and query
inputs and labels, active classes; a text model's inputs are dicts of ``input_ids`` and
``attention_mask``). The driver then reads one stage per line on standard input
(covariance, eigendecomposition, lambda, self, pairwise, quit), runs it with kronfluence's Analyzer
(EK-FAC, float64 in every dtype argument, the settings given), and answers one JSON line per stage:
``{"stage", "seconds", "peak_mib"}``. Scores are written to WORKDIR as ``kf_self.npy`` (N,) and
``kf_pairwise.npy`` (Q, N). The model and the data are those epochlens scores, built by the same
``epochlens.models.networks.build_model`` (the library's source is put on the path), or for
``tiny_bert`` / ``tiny_gpt2`` / ``tiny_t5`` by ``_common.text_model`` (needs ``transformers`` here;
GPT-2's Conv1D layers become the equal nn.Linear, see :func:`conv1d_as_linear`; the T5's loss is
:class:`TextToText`'s).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import _common  # puts the epochlens source on the path
import numpy as np
import torch
import torch.nn.functional as F
from kronfluence.analyzer import Analyzer, prepare_model
from kronfluence.arguments import FactorArguments, ScoreArguments
from kronfluence.task import Task
from torch import nn
from torch.utils.data import StackDataset, TensorDataset

from epochlens.models.networks import build_model

F64 = torch.float64


class ActiveClassification(Task):
    """Cross-entropy over the logits of the active classes (labels are class ids), as epochlens's
    ClassificationTask; the measurement is the query's loss. Batches are (images, labels) or, for a
    text model, dicts of ``input_ids``, ``attention_mask`` and ``labels`` (the model's ``logits``);
    the attention mask keeps padding out of the covariances, as in epochlens."""

    def __init__(self, active: np.ndarray) -> None:
        self.active = torch.as_tensor(active, dtype=torch.long)
        lookup = torch.full((int(self.active.max()) + 1,), -1, dtype=torch.long)
        lookup[self.active] = torch.arange(len(self.active))
        self.lookup = lookup

    def _logits_targets(self, batch, model):
        if isinstance(batch, Mapping):
            y = batch["labels"]
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        else:
            x, y = batch
            logits = model(x)
        logits = logits.index_select(1, self.active.to(logits.device))
        return logits, self.lookup.to(y.device)[y]

    def compute_train_loss(self, batch, model, sample: bool = False) -> torch.Tensor:
        logits, target = self._logits_targets(batch, model)
        if sample:
            with torch.no_grad():
                probs = torch.softmax(logits.detach(), dim=-1)
                target = torch.multinomial(probs, num_samples=1).flatten()
        return F.cross_entropy(logits, target, reduction="sum")

    def compute_measurement(self, batch, model) -> torch.Tensor:
        logits, target = self._logits_targets(batch, model)
        return F.cross_entropy(logits, target, reduction="sum")

    def get_attention_mask(self, batch):
        return batch["attention_mask"] if isinstance(batch, Mapping) else None


class TextToText(Task):
    """A text-to-text model's loss, as epochlens's TextToTextTask: per sample the mean NLL of its
    target tokens (the decoder labels, -100 ignored, no shift), summed over the batch (kronfluence's
    convention); the measurement is the query's loss. Masks per module: the encoder's layers and
    cross-attention's k and v see the encoder positions (attention mask), the other decoder layers
    and the head the decoder positions (labels != -100), as epochlens masks them."""

    def __init__(self, model: nn.Module) -> None:
        names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        self.encoder_side = [
            n
            for n in names
            if n.startswith("encoder.") or n.endswith(("EncDecAttention.k", "EncDecAttention.v"))
        ]
        self.decoder_side = [n for n in names if n not in self.encoder_side]

    @staticmethod
    def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        valid = labels != -100
        nll = F.cross_entropy(logits.transpose(1, 2), labels.masked_fill(~valid, 0), reduction="none")
        return ((nll * valid).sum(1) / valid.sum(1)).sum()

    def compute_train_loss(self, batch, model, sample: bool = False) -> torch.Tensor:
        logits = model(**batch).logits
        labels = batch["labels"]
        if sample:
            with torch.no_grad():
                probs = torch.softmax(logits.detach(), dim=-1)
                drawn = torch.multinomial(probs.flatten(0, 1), num_samples=1).view_as(labels)
                labels = torch.where(labels != -100, drawn, labels)
        return self._loss(logits, labels)

    def compute_measurement(self, batch, model) -> torch.Tensor:
        return self._loss(model(**batch).logits, batch["labels"])

    def get_attention_mask(self, batch):
        encoder, decoder = batch["attention_mask"], (batch["labels"] != -100).long()
        return {**{n: encoder for n in self.encoder_side}, **{n: decoder for n in self.decoder_side}}


def conv1d_as_linear(model: nn.Module) -> nn.Module:
    """GPT-2's ``Conv1D`` layers (y = x W + b, W stored (in, out)) replaced by the equal ``nn.Linear``
    (weight Wᵀ): kronfluence 1.0.1 tracks only Linear and Conv2d (its own GPT-2 examples do the same).
    The parameters are the same numbers transposed, so covariances, scores and timings match a
    library that tracks Conv1D directly, as epochlens does."""
    from transformers.pytorch_utils import Conv1D

    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                linear = nn.Linear(child.weight.shape[0], child.nf, dtype=child.weight.dtype)
                with torch.no_grad():
                    linear.weight.copy_(child.weight.t())
                    linear.bias.copy_(child.bias)
                setattr(parent, child_name, linear)
    return model


def _dataset(inputs: dict, x: str, y: str):
    labels = torch.as_tensor(inputs[y])
    if isinstance(inputs[x], Mapping):  # a text-to-text model's inputs hold its decoder labels
        return StackDataset(**{"labels": labels, **inputs[x]})
    return TensorDataset(inputs[x], labels)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdir", type=Path)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--query-batch-size", type=int, default=50)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    inputs = torch.load(args.workdir / "inputs.pt", weights_only=False)
    device = torch.device(args.device)
    if inputs["model"] in _common.TEXT_MODELS:
        model = _common.text_model(inputs["model"])
        model.load_state_dict(inputs["state_dict"])
        model = conv1d_as_linear(model)
    else:
        model = build_model(inputs["model"], inputs["num_classes"], inputs["x"].shape[1])
        model.load_state_dict(inputs["state_dict"])
    model = model.to(device).eval()
    seq2seq = inputs["model"] in _common.SEQ2SEQ_MODELS
    task = TextToText(model) if seq2seq else ActiveClassification(inputs["active"])
    model = prepare_model(model, task)
    train = _dataset(inputs, "x", "y")
    queries = _dataset(inputs, "xq", "yq")
    analyzer = Analyzer(
        analysis_name="bench",
        model=model,
        task=task,
        cpu=device.type == "cpu",
        disable_model_save=True,
        disable_tqdm=True,
        output_dir=str(args.workdir / "kronfluence"),
    )
    factor_args = FactorArguments(
        strategy="ekfac",
        use_empirical_fisher=True,
        activation_covariance_dtype=F64,
        gradient_covariance_dtype=F64,
        eigendecomposition_dtype=F64,
        per_sample_gradient_dtype=F64,
        lambda_dtype=F64,
    )
    score_args = ScoreArguments(
        damping_factor=None,  # 0.1 x the mean eigenvalue per module, as epochlens's relative 0.1
        per_sample_gradient_dtype=F64,
        precondition_dtype=F64,
        score_dtype=F64,
    )
    bs = args.batch_size
    common = {"factors_name": "ekfac", "factor_args": factor_args, "overwrite_output_dir": True}
    stages = {
        "covariance": lambda: analyzer.fit_covariance_matrices(
            dataset=train, per_device_batch_size=bs, **common
        ),
        "eigendecomposition": lambda: analyzer.perform_eigendecomposition(**common),
        "lambda": lambda: analyzer.fit_lambda_matrices(dataset=train, per_device_batch_size=bs, **common),
        "self": lambda: analyzer.compute_self_scores(
            scores_name="self",
            factors_name="ekfac",
            train_dataset=train,
            per_device_train_batch_size=bs,
            score_args=score_args,
            overwrite_output_dir=True,
        ),
        "pairwise": lambda: analyzer.compute_pairwise_scores(
            scores_name="pairwise",
            factors_name="ekfac",
            query_dataset=queries,
            train_dataset=train,
            per_device_query_batch_size=args.query_batch_size,
            per_device_train_batch_size=bs,
            score_args=score_args,
            overwrite_output_dir=True,
        ),
    }
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        stage = line.strip()
        if stage == "quit":
            break
        with _common.PeakMemory(device) as mem:
            seconds, _ = _common.timed(stages[stage], device)
        if stage in ("self", "pairwise"):
            scores = (
                analyzer.load_self_scores("self")
                if stage == "self"
                else analyzer.load_pairwise_scores("pairwise")
            )
            np.save(args.workdir / f"kf_{stage}.npy", scores["all_modules"].double().cpu().numpy())
        print(json.dumps({"stage": stage, "seconds": seconds, "peak_mib": mem.peak_mib}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
