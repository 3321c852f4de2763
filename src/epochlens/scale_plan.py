"""A study's influence and ablation jobs planned from its config alone (``epochlens plan``).

A transformer run's model is built on PyTorch's ``meta`` device from its ``config.json``: shapes
only, no weights read or allocated (Mistral-7B in 2 s). From the shapes come the tracked layers and
their factor groups under ``influence.factor_memory_gb``
(:func:`epochlens.influence.factor_groups.plan_groups`), the ablation units, each job's predicted
peak memory and the number of jobs. A job's peak is the sum of what it holds at its fullest:

* every job: a fixed cost (:data:`BASE_MB`: the interpreter, torch, transformers, Snakemake's
  modules), the weights (float32, as jobs load them) and one batch's activations
  (:func:`activations`);
* ``influence_factors``, the larger of its two moments for its largest layer group: the
  eigendecompositions (covariance sums, covariances and eigenvectors in float64, and the solver's
  temporaries of the largest matrix, :data:`EIGH_BYTES`) or a pass over the data (a batch's
  activations, what the pass sums, per-sample gradients of the largest layer);
* ``influence_scores``: the largest group's factors as stored (eigenvectors and eigenvalues, or the
  diagonal), the queries' preconditioned gradients held (``query_memory_gb`` at most) and the
  per-sample gradients of its largest layer;
* ``ablation_epoch``: forward passes only (one layer's activations at a time).

The fixed cost is measured (docs/measurements.md), the rest counted from the shapes;
``benchmarks/large_models.py`` prints predicted beside measured peaks, and a test holds them within
30% on small models. Without the shapes (a job's ``mem_mb`` while Snakemake plans, torch-free),
:func:`influence_cap` bounds the same terms from the settings alone. Nothing here is imported by a
job: changing it reruns nothing; torch is imported when a model is built.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

MB = 1e6

#: A transformer job's peak before its model counts (MB): the interpreter, torch, transformers,
#: Snakemake's modules, the job's own; the demo's polarity jobs (a 2-layer BERT of hidden 32) peaked
#: at 575-627 MB (Snakemake's max_rss of evaluate, influence_factors and influence_scores).
BASE_MB = 630
#: Bytes per n² of the eigendecomposition's temporaries of an n x n factor, beyond the factor and
#: its float64 eigenvectors: measured (``ru_maxrss`` around epochlens.influence.eigen.symmetric_eigh
#: of a 6144 x 6144 matrix on this CPU) 10.9 n² solving in float32, 15.3 n² in float64.
EIGH_BYTES = {"float32": 11, "float64": 16}
#: Per-sample gradient matrices of a layer a pass forms at once (the gradient, what is formed from it
#: and the rotation's two products: epochlens.influence.gradient_math.gradient_chunks).
GRADIENT_COPIES = 4


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """A rule's jobs of one run: how many, the peak one is predicted to reach, and why."""

    run: str
    rule: str
    jobs: int
    peak_mb: float
    detail: str


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the jobs' memory grows with: the model (built on the meta device), its weights' bytes
    (float32, as jobs load them: epochlens.models.hf) and the numbers one sample's activations
    hold with and without a backward pass."""

    model: nn.Module
    weight_bytes: int
    backward: int
    forward: int


def meta_model(folder: str | Path | Mapping, task: str) -> nn.Module:
    """The transformer of ``folder``'s config.json (or a config mapping) on the meta device."""
    import torch

    from epochlens.models.hf import _auto_class, load_config

    config = load_config(folder, task)
    with torch.device("meta"):
        return _auto_class(task).from_config(config)


def activations(config: Any, tokens: int, backward: bool) -> int:
    """The numbers one sample's activations hold in a transformer of ``config`` at ``tokens``: with
    ``backward``, every layer's saved tensors (about 16 hidden-sized and 4 MLP-sized vectors a
    token, the attention probabilities twice) and the logits three times (log-softmax and its
    gradient); without, one layer's at a time, the logits twice and, measured (ablation jobs of
    Mistral-shaped models, 4 to 8 layers), about 3 hidden-sized vectors a token a layer more."""
    hidden = getattr(config, "hidden_size", None) or getattr(config, "d_model", 0)
    mlp = getattr(config, "intermediate_size", None) or getattr(config, "d_ff", None) or 4 * hidden
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "num_heads", 1)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", 1)
    vocab = getattr(config, "vocab_size", 0)
    per_layer = tokens * (16 * hidden + 4 * mlp) + 2 * heads * tokens**2
    if not backward:
        return per_layer // 4 + 2 * tokens * vocab + 3 * layers * tokens * hidden
    return layers * per_layer + 3 * tokens * vocab


def model_shape(folder: str | Path | Mapping, task: str, tokens: int) -> ModelShape:
    """The :class:`ModelShape` of the transformer of ``folder`` (or a config mapping) with the
    ``model.hf.task`` head, ``tokens`` a sample."""
    model = meta_model(folder, task)
    cfg = model.config
    weights = 4 * sum(p.numel() for p in model.parameters())
    return ModelShape(model, weights, activations(cfg, tokens, True), activations(cfg, tokens, False))


def influence_cap(model_bytes: int, influence: Mapping[str, Any] | None) -> float:
    """The most an influence job holds for a model of ``model_bytes`` under the run's ``influence``
    section, without its shapes: the weights and a batch's activations (3 copies), one layer
    group's factors and eigendecomposition (1.5 x ``factor_memory_gb``) and the held query
    gradients (``query_memory_gb``) (bytes; no bound without the section). A 7B model's 16
    copies would ask for 464 GB."""
    if influence is None:
        return float("inf")
    budgets = 1.5 * influence.get("factor_memory_gb", 4) + influence.get("query_memory_gb", 2)
    return 3 * model_bytes + budgets * 2**30


def _largest(layers, key) -> int:
    return max((key(i) for i in layers), default=0)


def factors_peak(layers: list, method: str, settings, activations: int) -> float:
    """Bytes the factors job holds beyond the model for the group ``layers`` (LayerInfo), at the
    larger of its two moments: the eigendecompositions (covariance sums, covariances and
    eigenvectors, float64, and the solver's temporaries of one matrix) and a pass over the data
    (one batch's ``activations``, per-sample gradients and what the pass sums: EK-FAC's eigenvectors
    and corrections, K-FAC's covariance sums, the diagonal)."""
    squares = sum(i.in_dim**2 + i.out_dim**2 for i in layers)
    rect = sum(i.out_dim * i.in_dim for i in layers)
    n = _largest(layers, lambda i: max(i.in_dim, i.out_dim))
    single = settings.eigh_float32_from is not None and n >= settings.eigh_float32_from
    eigen = (
        0 if method == "diagonal" else 3 * 8 * squares + EIGH_BYTES["float32" if single else "float64"] * n**2
    )
    summed = {"ekfac": 2 * squares + 2 * rect, "kfac": squares, "diagonal": 2 * rect}[method]
    return max(eigen, activations + _gradients(layers) + 8 * summed)


def _gradients(layers: list) -> int:
    """Per-sample gradient matrices formed at once: a chunk, or one sample's of the largest layer."""
    from epochlens.influence.gradient_math import CHUNK_BYTES

    return max(CHUNK_BYTES, GRADIENT_COPIES * 8 * _largest(layers, lambda i: i.out_dim * i.in_dim))


def scores_peak(layers: list, method: str, settings, queries: int) -> float:
    """Bytes the scores job holds beyond the model for the group ``layers``: its stored factors,
    the queries' preconditioned gradients held, per-sample gradients."""
    rect = sum(i.out_dim * i.in_dim for i in layers)
    squares = sum(i.in_dim**2 + i.out_dim**2 for i in layers)
    stored = {"ekfac": squares + rect, "kfac": squares, "diagonal": rect}.get(method, 0)
    held = max(rect * 8, min(settings.query_memory_gb * 2**30, queries * rect * 8))
    return 8 * stored + held + _gradients(layers)


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g}"


def influence_jobs(shape: ModelShape, method: str, settings, queries: int) -> dict[str, tuple[float, str]]:
    """``{rule: (peak bytes, what it holds)}`` of one checkpoint's influence jobs of ``method``:
    the factors job (methods that fit factors) and the scores job, at their largest layer group."""
    from epochlens.influence.factor_groups import plan_groups
    from epochlens.influence.layer_selection import select_layers
    from epochlens.influence.settings import FACTOR_METHODS

    layers = select_layers(shape.model, settings.layers, settings.exclude_layers)
    groups = [[layers[n] for n in g] for g in plan_groups(layers, method, settings.factor_memory_gb)]
    if method not in FACTOR_METHODS:
        groups = [list(layers.values())]  # identity, tracin: every layer's gradients at once
    weights, per_sample = shape.weight_bytes, 4 * shape.backward
    fit = settings.factor_batch_size * per_sample
    score = max(settings.train_batch_size, settings.query_batch_size) * per_sample
    held = {"influence_scores": score + max(scores_peak(g, method, settings, queries) for g in groups)}
    if method in FACTOR_METHODS:
        held["influence_factors"] = max(factors_peak(g, method, settings, fit) for g in groups)
    head = f"{method}, {len(layers)} layers in {len(groups)} groups: GB weights {_gb(weights)}"
    return {
        rule: (BASE_MB * MB + weights + b, f"{head}, activations, factors and gradients {_gb(b)}")
        for rule, b in sorted(held.items())
    }


def ablation_job(shape: ModelShape, settings) -> tuple[float, str]:
    """(peak bytes, what it holds) of one checkpoint's ablation job, and its forward passes."""
    from epochlens.ablation.heads import text_units

    units = len(text_units(shape.model, settings))  # the first part's (the largest: parts differ by one)
    itemsize = 4 if settings.precision == "float32" else 2  # autocast to 16 bits
    act = settings.batch_size * shape.forward * itemsize
    passes = units * len(settings.modes) + 1
    detail = f"{units} units x {len(settings.modes)} modes: {passes} passes a job; GB weights "
    return (
        BASE_MB * MB + shape.weight_bytes + act,
        detail + f"{_gb(shape.weight_bytes)}, activations {_gb(act)}",
    )


def run_model(name: str, run: Mapping[str, Any], workdir: str | Path = ".") -> str | Path | Mapping | None:
    """Where a transformer run's model config is: ``model.hf.config`` (trained by the pipeline), or
    the folder of its first checkpoint analysed (its config.json; weights not needed). None: not a
    transformer run."""
    from epochlens.config.epochs import analysis_epochs
    from epochlens.config.inputs import checkpoint_path

    hf = run.get("model", {}).get("hf")
    if not hf:
        return None
    if hf.get("config"):
        return hf["config"]
    index, epoch = (run.get("indices") or [0])[0], analysis_epochs(name, dict(run))[-1]
    return Path(workdir) / checkpoint_path(name, run, index, epoch)


def _settings(cls: type, section: Mapping[str, Any], exclude: str = ""):
    """``cls`` from the config ``section``'s fields (those that change results and those that do not)."""
    return cls(
        **{
            f.name: section[f.name]
            for f in dataclasses.fields(cls)
            if f.name in section and f.name != exclude
        }
    )


def run_plan(name: str, run: Mapping[str, Any], folder: str | Path | Mapping) -> list[JobPlan]:
    """The influence and ablation jobs of one run whose model config is ``folder``
    (:func:`run_model`): each rule's job count and predicted peak."""
    from epochlens.ablation.settings import AblationSettings
    from epochlens.config.epochs import influence_epochs, influence_indices, section_epochs
    from epochlens.influence.settings import InfluenceSettings

    spec = run.get("influence") or {}
    settings = _settings(InfluenceSettings, spec, exclude="method")
    tokens = run["data"].get("text", {}).get("max_length", 128)
    shape = model_shape(folder, run["model"]["hf"].get("task", "sequence_classification"), tokens)
    plans = []
    checkpoints = len(influence_epochs(name, dict(run))) * len(influence_indices(name, dict(run)))
    queries = (spec.get("queries") or {}).get("max_count") or 1000
    shards = max(1, int(spec.get("shards", 1) or 1))
    if shards > 1:  # sharded jobs hold every layer's factors (layer groups: unsharded jobs only)
        settings = dataclasses.replace(settings, factor_memory_gb=float("inf"))
    for method in spec.get("methods", []) if spec.get("enabled", True) and checkpoints else []:
        for rule, (peak, detail) in influence_jobs(shape, method, settings, queries).items():
            per_checkpoint = 1 if shards == 1 else shards + 1  # the shards and their merge
            if rule == "influence_factors" and method == "ekfac" and shards > 1:
                per_checkpoint = 2 * shards + 2  # covariances, eigenbasis, corrections, factors
            rule += " and shards" if shards > 1 else ""  # counted together; the peak is the merge's
            plans.append(JobPlan(name, rule, checkpoints * per_checkpoint, peak / MB, detail))
    ablation = section_epochs(name, dict(run), "ablation") if run.get("ablation") else []
    if ablation:
        abl = _settings(AblationSettings, run["ablation"])
        peak, detail = ablation_job(shape, abl)
        jobs = len(ablation) * len(run.get("indices") or [0])
        rule = "ablation_part" if abl.parts > 1 else "ablation_epoch"  # (+ a merge per checkpoint)
        plans.append(JobPlan(name, rule, jobs * abl.parts, peak / MB, detail))
    return plans


def study_plan(config: Mapping[str, Any], workdir: str | Path = ".") -> tuple[list[JobPlan], list[str]]:
    """Every transformer run's influence and ablation jobs, and the runs left out (not transformers:
    ``epochlens doctor --profile`` sizes those from their checkpoints)."""
    plans, others = [], []
    for name, run in config.get("runs", {}).items():
        folder = run_model(name, run, workdir)  # lists the run's checkpoints: once a run
        if folder is None:
            others.append(name)
        else:
            plans += run_plan(name, run, folder)
    return plans, others


def format_plan(plans: list[JobPlan], others: list[str], gpu_gb: float | None = None) -> str:
    """The plan as a table: run, rule, jobs, predicted peak (GB) and what it holds."""
    lines = [f"{'run':<16} {'rule':<18} {'jobs':>5} {'peak GB':>8}  detail"]
    for p in plans:
        over = "  (over the GPU's memory)" if gpu_gb and p.peak_mb / 1e3 > gpu_gb else ""
        lines.append(f"{p.run:<16} {p.rule:<18} {p.jobs:>5} {p.peak_mb / 1e3:>8.1f}  {p.detail}{over}")
    lines.append(f"{sum(p.jobs for p in plans)} influence and ablation jobs in all")
    if gpu_gb and any(p.peak_mb / 1e3 > gpu_gb for p in plans):
        lines.append(
            "Over the GPU's memory: lower influence.factor_memory_gb (the factors), query_memory_gb (the "
            "held queries), the batch sizes or data.text.max_length (the activations)."
        )
    if others:
        lines.append(f"Not transformer runs (sized by epochlens doctor --profile): {', '.join(others)}")
    return "\n".join(lines)


def add_parser(sub, snakefile: Path) -> None:
    """The ``plan`` subcommand of ``epochlens`` (its ``sub``parsers), ``snakefile`` the workflow's."""
    plan = sub.add_parser(
        "plan",
        help="a transformer study's influence and ablation jobs from its config alone: count, peak memory",
        description="Build each transformer run's model from its config.json on the meta device (no "
        "weights read: a 7B model in seconds) and print each influence and ablation rule's job count and "
        "predicted peak memory: the weights (float32), one batch's activations, the largest "
        "layer group's factors (influence.factor_memory_gb) and the held query gradients.",
    )
    plan.add_argument("--configfile", nargs="*", default=[], help="your config file(s) (default: embedded)")
    plan.add_argument("--snakefile", default=str(snakefile), help="the workflow's Snakefile")
    plan.add_argument("--directory", default=".", help="the working directory checkpoints are relative to")
    plan.add_argument("--gpu-gb", type=float, help="mark the jobs predicted to exceed this much memory (GB)")
    plan.add_argument("--json", action="store_true", help="print the jobs as JSON")
    plan.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    """``epochlens plan``: the plan of ``args.configfile``'s study, as a table or JSON."""
    import json
    import os
    import sys

    from snakemake_interface_common.exceptions import WorkflowError

    from epochlens import rule_devices
    from epochlens.errors import EpochlensError

    here, snakefile = Path.cwd(), Path(args.snakefile).resolve()
    configfiles = [Path(f).resolve() for f in args.configfile]
    try:  # the config's paths are relative to the working directory
        os.chdir(args.directory)
        _, config = rule_devices.workflow_rules(snakefile, configfiles, Path.cwd())
        plans, others = study_plan(config)
    except (EpochlensError, WorkflowError) as e:
        print(f"epochlens plan: {e}", file=sys.stderr)
        return 1
    finally:
        os.chdir(here)
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"jobs": [asdict(p) for p in plans], "not_planned": others}, indent=2))
    else:
        print(format_plan(plans, others, args.gpu_gb))
    return 0
