"""Benchmark: time per stage of the influence engine on the digits SmallCNN and the LoP ResNet-18, or
on a tiny transformer (``--model tiny_bert`` / ``tiny_gpt2`` / ``tiny_t5``).

Stages: covariances (one forward/backward pass over the training samples, float64 sums),
eigendecomposition (of every layer's A and S), corrections (EK-FAC's second pass, or the diagonal),
self-influence (one pass) and pairwise influence (ceil(Q / query_batch_size) passes over the
training samples). Inputs are random (N(0, 1)) at the models' native sizes: 1x8x8 for SmallCNN
(10 classes, 5 active), 3x32x32 for ResNet-18 (100 classes, 50 active); weights are the models'
random initialisation. Eigendecomposition time does not depend on the number of samples; on
ResNet-18 it is dominated by the 4609x4609 activation covariances of layer4 (512 channels x 3x3
patches + bias).

The tiny transformers (``_common.text_model``: two-class sequence classifiers of ``transformers``
built from a config, 2 layers, 2 heads, hidden 32, intermediate 64, vocabulary 100; nothing
downloaded) score random token sequences of 4..24 real tokens right-padded to 24, with their
attention masks, as a text run does (a Dataset of dicts holding the labels, classification over both
classes). Tracked: every nn.Linear (those of attention and MLP with a token dimension, padding
masked; BERT's pooler and classifier; GPT-2's score head) and GPT-2's Conv1D. ``tiny_t5`` is a
text-to-text T5 of the same sizes (encoder and decoder of 2 blocks, d_kv 16; its head tied to the
shared embedding) under the text_to_text task: random prompts as above, random decoder labels of
1..6 tokens ending with eos (1), -100 padding; every nn.Linear of encoder, decoder and head tracked,
encoder layers and cross-attention's k/v masked by the attention mask, the rest by labels != -100.

Usage (on a machine shared with other jobs, --threads 1 keeps their load out of the timings):
    .venv/bin/python benchmarks/influence.py --model small_cnn --n-train 256 --n-query 16 --json
    .venv/bin/python benchmarks/influence.py --model resnet18_lop --n-train 16 --n-query 4 --json

Against kronfluence 1.0.1 (``--kronfluence PYTHON``: the Python of a virtual environment that holds
it; it runs ``benchmarks/_kronfluence.py`` in a subprocess on the same model, weights, training
inputs and queries; for the tiny transformers kronfluence's task returns the attention mask, and
GPT-2's Conv1D layers become the equal nn.Linear, the only layers it tracks): EK-FAC with matched
settings, i.e. the empirical Fisher, float32 forward and backward passes and float64 everywhere else
(kronfluence's activation/gradient covariance, eigendecomposition, lambda, per-sample gradient,
precondition and score dtypes; epochlens's defaults), damping 0.1 x each layer's mean eigenvalue
(kronfluence's heuristic, epochlens's relative 0.1), both holding ``--kf-query-batch-size``
preconditioned query gradients at once. Stages are interleaved (epochlens, kronfluence, then
kronfluence, epochlens, ...; ``--repeats`` rounds, the fastest of each kept), each with its peak
memory; the report gives every stage's seconds and ratio and the Spearman correlations of the two
libraries' self-influence and pairwise scores; ``peak_ratio`` is epochlens's peak memory over
kronfluence's in a stage (each measured from the stage's start: the CUDA allocator's peak, or the
process's peak RSS on the CPU), ``total.peak_ratio_max`` the largest of them. Results go to
``--out`` (JSON) after every stage, so an interrupted run keeps what it measured. Setting up
kronfluence's environment (never let pip touch torch; no torchvision)::

    python3 -m venv /work/kf-venv && /work/kf-venv/bin/pip install torch==2.13.0
    /work/kf-venv/bin/pip install --no-deps kronfluence==1.0.1
    /work/kf-venv/bin/pip install accelerate safetensors opt_einsum einconv einops tqdm numpy \
        transformers -c <(echo torch==2.13.0)
    nice .venv/bin/python benchmarks/influence.py --model resnet18_lop --n-train 1000 --n-query 100 \
        --kronfluence /work/kf-venv/bin/python --threads 2 --out influence_vs_kronfluence.json
    nice .venv/bin/python benchmarks/influence.py --model tiny_bert --n-train 1000 --n-query 100 \
        --kronfluence /work/kf-venv/bin/python --threads 2 --repeats 3 --out kronfluence_bert.json

The projected hours for 50,000 training images x 21 checkpoints are computed only from a run on a
GPU (``projection``); on a CPU the field says so.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
import warnings
from pathlib import Path

import _common
import numpy as np
import torch

from epochlens.influence import (
    InfluenceSettings,
    fit_factors,
    pairwise_influence,
    self_influence,
)
from epochlens.influence.covariances import covariance_sums
from epochlens.influence.factors import apply_corrections, correction_sums, eigendecompose, empty_factors
from epochlens.influence.study_inputs import with_labels
from epochlens.models.networks import build_model
from epochlens.tasks import TextToTextTask

# (in_channels, side, num_classes, active classes) of the benchmark input per model.
SHAPES = {"small_cnn": (1, 8, 10, 5), "resnet18_lop": (3, 32, 100, 50)}


def _inputs(name: str, args: argparse.Namespace) -> dict:
    """The model's name and weights, the training and query inputs and labels, the active classes:
    what both libraries score (written to ``inputs.pt`` for kronfluence's side). Text inputs are
    dicts of ``input_ids`` and ``attention_mask`` (see ``_common.token_batch``)."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if name in _common.TEXT_MODELS:
        model, num_classes, n_active = _common.text_model(name), 2, 2
        x = _common.token_batch(args.n_train, gen)
        xq = _common.token_batch(args.n_query, gen)
        if name in _common.SEQ2SEQ_MODELS:  # the decoder's labels go in with the inputs
            x["labels"] = _common.target_batch(args.n_train, gen)
            xq["labels"] = _common.target_batch(args.n_query, gen)
    else:
        channels, side, num_classes, n_active = SHAPES[name]
        model = build_model(name, num_classes, channels).eval()
        x = torch.randn(args.n_train, channels, side, side, generator=gen)
        xq = torch.randn(args.n_query, channels, side, side, generator=gen)
    return {
        "model": name,
        "num_classes": num_classes,
        "state_dict": model.state_dict(),
        "x": x,
        "xq": xq,
        "y": torch.randint(0, n_active, (args.n_train,), generator=gen).numpy(),
        "yq": torch.randint(0, n_active, (args.n_query,), generator=gen).numpy(),
        "active": np.arange(n_active),
    }


def _model(inputs: dict, device: torch.device) -> torch.nn.Module:
    """The model of :func:`_inputs` with its weights, on ``device``, in eval mode."""
    name = inputs["model"]
    if name in _common.TEXT_MODELS:
        model = _common.text_model(name)
    else:
        model = build_model(name, inputs["num_classes"], inputs["x"].shape[1])
    model.load_state_dict(inputs["state_dict"])
    return model.to(device).eval()


def _data(inputs: dict) -> tuple:
    """(x, y, xq, yq, active) as epochlens takes them: text as Datasets of dicts that hold the labels
    (y and yq None), as a text run's influence jobs pass them."""
    x, y = with_labels(inputs["x"], inputs["y"])
    xq, yq = with_labels(inputs["xq"], inputs["yq"])
    seq2seq = inputs["model"] in _common.SEQ2SEQ_MODELS  # its task has no classes
    return x, y, xq, yq, None if seq2seq else inputs["active"]


def _task(name: str) -> TextToTextTask | None:
    """The text-to-text task for a text-to-text model; None (classification) for the others."""
    return TextToTextTask() if name in _common.SEQ2SEQ_MODELS else None


def bench_once(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    inputs = _inputs(name, args)
    model = _model(inputs, device)
    x, y, xq, yq, active = _data(inputs)
    task = _task(name)
    settings = InfluenceSettings(
        method=args.method,
        fisher=args.fisher,
        layers=tuple(args.layers),
        factor_batch_size=args.batch_size,
        train_batch_size=args.batch_size,
        query_batch_size=args.query_batch_size,
        precondition_dtype=args.precondition_dtype,
    )
    t_fit, factors = _common.timed(
        lambda: fit_factors(model, x, y, active, settings, device=device, task=task), device
    )
    t_self, selfs = _common.timed(
        lambda: self_influence(model, factors, x, y, active, settings, device=device, task=task), device
    )
    t_pair, pair = _common.timed(
        lambda: pairwise_influence(model, factors, x, y, xq, yq, active, settings, device=device, task=task),
        device,
    )
    diag = pair.diagnostics
    dims = [max(lf.in_dim, lf.out_dim) for lf in factors.layers.values()]
    finite = diag["cond"][np.isfinite(diag["cond"])]
    return {
        "model": name,
        **_common.environment(device),
        "method": args.method,
        "fisher": args.fisher,
        "n_train": args.n_train,
        "n_query": args.n_query,
        "batch_size": args.batch_size,
        "query_batch_size": args.query_batch_size,
        "precondition_dtype": args.precondition_dtype,
        "layers_tracked": len(factors.layers),
        "params_tracked": int(sum(lf.out_dim * lf.in_dim for lf in factors.layers.values())),
        "largest_factor_dim": max(dims),
        "seconds": {
            **{k: round(v, 3) for k, v in factors.timings.items()},
            "fit_total": round(t_fit, 3),
            "self_influence": round(t_self, 3),
            "pairwise": round(t_pair, 3),
        },
        "max_cond": float(finite.max()) if len(finite) else None,
        "damping_steps_total": int(diag["damping_steps"].sum()),
        "eigen_fallbacks": int(diag["solver"].str.contains("<-").sum()),
        "skipped_samples": int(len(selfs.skipped)),
        "scores_finite": bool(np.isfinite(selfs.scores).all() and np.isfinite(pair.scores).all()),
    }


def _rates(seconds: dict, args: argparse.Namespace) -> dict:
    """Training samples per second of the passes over the data (pairwise: sample-query pairs)."""
    return {
        "covariances": round(args.n_train / seconds.get("covariances", math.nan), 2),
        "self_influence": round(args.n_train / seconds["self_influence"], 2),
        "pairwise_pairs": round(args.n_train * args.n_query / seconds["pairwise"], 2),
    }


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    """:func:`bench_once` ``--repeats`` times: each stage's fastest time."""
    runs = []
    for _ in range(args.repeats):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if args.json else "default")
            runs.append(bench_once(name, args, device))
    report = runs[-1]
    report["repeats"] = args.repeats
    report["seconds"] = {k: min(r["seconds"][k] for r in runs) for k in report["seconds"]}
    report["train_samples_per_s"] = _rates(report["seconds"], args)
    return report


#: epochlens's stage -> kronfluence's (the driver's command).
KF_STAGES = {
    "covariance": "covariance",
    "eigendecomposition": "eigendecomposition",
    "corrections": "lambda",
    "self_influence": "self",
    "pairwise": "pairwise",
}


class _Kronfluence:
    """The kronfluence driver (benchmarks/_kronfluence.py) in a subprocess, one stage per request."""

    def __init__(self, python: str, workdir: Path, args: argparse.Namespace, device: torch.device) -> None:
        cmd = [
            python,
            str(Path(__file__).with_name("_kronfluence.py")),
            str(workdir),
            "--batch-size",
            str(args.batch_size),
            "--query-batch-size",
            str(args.kf_query_batch_size),
            "--device",
            str(device),
        ]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the kronfluence driver stopped (exit status {self.proc.wait()})")
        return json.loads(line)

    def run(self, stage: str) -> dict:
        self.proc.stdin.write(stage + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait()


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    ok = np.isfinite(a) & np.isfinite(b)
    return float(spearmanr(a[ok], b[ok]).statistic)


def _time_stage(stage: str, fn, kf: _Kronfluence, repeats: int, device: torch.device) -> dict:
    """One stage, epochlens and kronfluence interleaved (A B, B A, ...): best time and peak memory of each."""
    best = {"epochlens": math.inf, "kronfluence": math.inf}
    peak = {"epochlens": 0.0, "kronfluence": 0.0}
    for rep in range(repeats):
        order = ("epochlens", "kronfluence") if rep % 2 == 0 else ("kronfluence", "epochlens")
        for side in order:
            if side == "epochlens":
                with warnings.catch_warnings(), _common.PeakMemory(device) as mem:
                    warnings.simplefilter("ignore")
                    seconds, _ = _common.timed(fn, device)
                mib = mem.peak_mib
            else:
                answer = kf.run(KF_STAGES[stage])
                seconds, mib = answer["seconds"], answer["peak_mib"]
            best[side] = min(best[side], seconds)
            peak[side] = max(peak[side], mib)
    return {
        "epochlens_s": round(best["epochlens"], 2),
        "kronfluence_s": round(best["kronfluence"], 2),
        "ratio": round(best["epochlens"] / best["kronfluence"], 3),
        "epochlens_peak_mib": round(peak["epochlens"], 1),
        "kronfluence_peak_mib": round(peak["kronfluence"], 1),
        "peak_ratio": round(peak["epochlens"] / peak["kronfluence"], 3),
    }


def compare_kronfluence(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    """Stage by stage, interleaved: epochlens in this process, kronfluence in its own (see the doc)."""
    inputs = _inputs(name, args)
    model = _model(inputs, device)
    x, y, xq, yq, active = _data(inputs)
    task = _task(name)
    params = sum(lf.out_dim * lf.in_dim for lf in empty_factors(model, InfluenceSettings()).layers.values())
    # Room for exactly kf_query_batch_size preconditioned query gradients (float64), as kronfluence.
    memory_gb = (args.kf_query_batch_size + 0.5) * params * 8 / 2**30
    settings = InfluenceSettings(
        method="ekfac",
        fisher="empirical",
        factor_batch_size=args.batch_size,
        train_batch_size=args.batch_size,
        query_batch_size=args.query_batch_size,
        query_memory_gb=memory_gb,
        eigh_workers=args.eigh_workers,
        eigh_float32_from=args.eigh_float32_from,
    )
    state: dict = {}

    def covariance():
        state["sums"] = covariance_sums(model, x, y, active, settings, device=device, task=task)

    def eigen():
        state["factors"] = eigendecompose(empty_factors(model, settings), state["sums"], settings, device)

    def corrections():
        sums = correction_sums(model, state["factors"], x, y, active, settings, device=device, task=task)
        apply_corrections(state["factors"], sums)

    def self_scores():
        state["self"] = self_influence(
            model, state["factors"], x, y, active, settings, device=device, task=task
        )

    def pairwise():
        state["pairwise"] = pairwise_influence(
            model, state["factors"], x, y, xq, yq, active, settings, device=device, task=task
        )

    ours = {
        "covariance": covariance,
        "eigendecomposition": eigen,
        "corrections": corrections,
        "self_influence": self_scores,
        "pairwise": pairwise,
    }
    report = {
        "model": name,
        **_common.environment(device),
        "comparison": "epochlens vs kronfluence 1.0.1, EK-FAC, empirical Fisher, float32 forward, float64 "
        "factors/gradients/scores, damping 0.1 x mean eigenvalue",
        "n_train": args.n_train,
        "n_query": args.n_query,
        "batch_size": args.batch_size,
        "queries_held": args.kf_query_batch_size,
        "params_tracked": int(params),
        "repeats": args.repeats,
        "stages": {},
    }
    out = Path(args.out) if args.out else None
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
        work = Path(tmp)
        torch.save(inputs, work / "inputs.pt")
        kf = _Kronfluence(args.kronfluence, work, args, device)
        try:
            for stage, fn in ours.items():
                report["stages"][stage] = _time_stage(stage, fn, kf, args.repeats, device)
                _summarise(report, args, device)
                if out is not None:
                    out.write_text(json.dumps(report, indent=2))
                if not args.json:
                    print(stage, report["stages"][stage], flush=True)
            kf_self = np.load(work / "kf_self.npy")
            kf_pair = np.load(work / "kf_pairwise.npy")
        finally:
            kf.close()
    ours_self, ours_pair = state["self"].scores, state["pairwise"].scores
    per_query = [_spearman(ours_pair[q], kf_pair[q]) for q in range(len(ours_pair))]
    report["spearman"] = {
        "self_influence": round(_spearman(ours_self, kf_self), 5),
        "pairwise_all": round(_spearman(ours_pair.ravel(), kf_pair.ravel()), 5),
        "pairwise_per_query_min": round(min(per_query), 5),
        "pairwise_per_query_mean": round(float(np.mean(per_query)), 5),
    }
    if out is not None:
        out.write_text(json.dumps(report, indent=2))
    return report


def _summarise(report: dict, args: argparse.Namespace, device: torch.device) -> None:
    stages = report["stages"]
    ours = sum(v["epochlens_s"] for v in stages.values())
    theirs = sum(v["kronfluence_s"] for v in stages.values())
    report["total"] = {
        "stages": list(stages),
        "epochlens_s": round(ours, 2),
        "kronfluence_s": round(theirs, 2),
        "ratio": round(ours / theirs, 3) if theirs else None,
        "peak_ratio_max": max(v["peak_ratio"] for v in stages.values()),
    }
    if device.type != "cuda":
        report["projection"] = "none: projected GPU hours need a run on a GPU (this one ran on the CPU)"
        return
    per_image = sum(stages[s]["epochlens_s"] for s in stages if s != "eigendecomposition") / args.n_train
    fixed = stages.get("eigendecomposition", {}).get("epochlens_s", 0.0)
    hours = 21 * (fixed + 50_000 * per_image) / 3600
    report["projection"] = {
        "what": f"50,000 training images x 21 checkpoints, {args.n_query} queries, "
        f"one {_common.device_name(device)}",
        "hours": round(hours, 1),
        "from": "measured seconds per training image (covariances, corrections, self, pairwise) and the "
        "eigendecomposition per checkpoint",
    }


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser(__doc__, repeats=1, more_models=_common.TEXT_MODELS)
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--n-query", type=int, default=8)
    parser.add_argument("--method", choices=["ekfac", "kfac", "diagonal", "identity"], default="ekfac")
    parser.add_argument("--fisher", choices=["true", "expected", "empirical"], default="true")
    parser.add_argument("--layers", nargs="*", default=[], help="fnmatch patterns of layers (default all)")
    parser.add_argument("--batch-size", type=int, default=32, help="factor and training batches")
    parser.add_argument("--query-batch-size", type=int, default=16)
    parser.add_argument("--precondition-dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--eigh-workers", type=int, default=1, help="eigendecompositions at once")
    parser.add_argument(
        "--eigh-float32-from",
        type=lambda v: None if v == "none" else int(v),
        default=2048,
        help="factors of this dimension or more eigendecomposed in float32 ('none': all float64)",
    )
    parser.add_argument(
        "--kronfluence",
        metavar="PYTHON",
        help="compare with kronfluence 1.0.1 run by this Python (its own virtual environment)",
    )
    parser.add_argument(
        "--kf-query-batch-size",
        type=int,
        default=50,
        help="comparison: preconditioned query gradients held at once by both libraries",
    )
    parser.add_argument("--out", help="comparison: JSON report written after every stage")
    args = parser.parse_args(argv)
    if args.kronfluence:
        return _common.run(parser, compare_kronfluence, argv)
    return _common.run(parser, bench_model, argv)


if __name__ == "__main__":
    raise SystemExit(main())
