"""The memory each job asks for (Snakemake's ``mem_mb``), from the shapes of the run it works on.

A job's peak is what the interpreter and its libraries take, plus what it holds per sample of the
data set (outputs, a pickle read whole) and per query too (scores), plus model-sized buffers
(weights, gradients, factors). :data:`RULES` gives each rule those numbers, measured with
``benchmarks/scale.py`` (slopes between sizes: docs/measurements.md); :func:`mem_mb` adds them up
for a job's :class:`RunShape` with :data:`HEADROOM` and multiplies by the attempt, so that a job
killed for memory is submitted again with twice, then three times as much (``retries``).

The workflow declares ``mem_mb`` through :func:`job_mem_mb` for the rules that hold data or a
model (rules/common.smk: ``get_mem_mb``; the others get the profile's ``default-resources``);
Snakemake evaluates it again when the job's inputs exist, so the shapes are the run's own. A
profile's ``set-resources: <rule>: {mem_mb: ...}`` still wins. Nothing here imports torch, and no
job imports this module: changing a number reruns nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from epochlens.influence.projection_settings import PROJECTED_METHODS, ProjectionSettings
from epochlens.memory_sources import dossier_rows, held_bytes, model_bytes, size, stored_sizes
from epochlens.scale_plan import influence_cap

#: Peak measured x HEADROOM: what the job asks for at its first attempt.
HEADROOM = 1.5
MB = 1e6
#: Inputs whose bytes a job reads whole: ``prepare_data``'s source files, a merge's shards.
SIZED_INPUTS = ("source", "shards")


@dataclass(frozen=True)
class RunShape:
    """What a job's memory grows with: the data set's samples (train and test), one's bytes as
    stored (pixels, token ids), the largest model it loads, the files it reads whole
    (:data:`SIZED_INPUTS`), whether the data are text, and what influence sets (below)."""

    samples: int = 0
    sample_bytes: int = 0
    model_bytes: int = 0
    input_bytes: int = 0
    text: bool = False
    model_cap: float = math.inf  # the most an influence job holds for it (scale_plan.influence_cap)
    score_columns: int = 0  # the queries x their transforms an influence scoring job scores
    pairwise_gb: float = math.inf  # scores kept whole up to this (GiB of float32): projected methods'
    curvature: int = 0  # numbers of a job's whole projected curvature (trak's: trak_dim²)


@dataclass(frozen=True)
class Memory:
    """A rule's peak in MB: ``base_mb`` + ``per_sample`` bytes x samples + ``model_copies`` x the
    model (at most the shape's ``model_cap`` where ``capped``) + ``input_copies`` x the files it
    reads whole + ``per_score`` bytes x samples x score columns (none where ``summarised`` and
    their float32 pass the shape's ``pairwise_gb``: a store's summary, see store_summary; its
    readers, where the run's methods are all projected) + ``per_curvature`` bytes x its curvature."""

    base_mb: float = 400
    per_sample: float = 0.0
    model_copies: float = 0.0
    input_copies: float = 0.0
    capped: bool = False
    per_score: float = 0.0
    summarised: bool = False
    per_curvature: float = 0.0

    def peak_mb(self, shape: RunShape) -> float:
        """The expected peak of a job of this rule on ``shape`` (MB, no headroom)."""
        held = (
            self.per_sample * shape.samples
            + min(self.model_copies * shape.model_bytes, shape.model_cap if self.capped else math.inf)
            + self.input_copies * shape.input_bytes
            + self.per_score * self._scores(shape)
            + self.per_curvature * shape.curvature
        )
        return self.base_mb + (TEXT_MB if shape.text else 0) + held / MB

    def _scores(self, shape: RunShape) -> float:
        scores = shape.samples * shape.score_columns
        return 0.0 if self.summarised and 4.0 * scores > shape.pairwise_gb * 2**30 else scores


#: Each rule's fixed cost is its job's own peak (``ru_maxrss``) on the smallest of the runs of
#: ``benchmarks/scale.py --model small_cnn`` (every stage at 5,000, 20,000 and 100,000
#: CIFAR-shaped training images, the per-sample stages at 1,000,000; 10,000 test images), rounded
#: up: the interpreter, torch and the job's buffers (a script job takes 190 MB before it starts:
#: Snakemake's own modules); per sample, a slope that keeps every measured peak below the request
#: (the slopes between sizes fall as N grows: the sample outputs' 2 KB a sample from 5,000 to
#: 20,000 is 0.2 KB from 100,000 to 1,000,000); model copies: the weights and, on a CPU, the
#: activations of a batch: a ResNet-18 (45 MB) in the small CNN's place took 610 MB more in the
#: evaluation and the sample outputs at 10,000 images (13.6 copies: 8 with the headroom covers
#: it; 12 for curvature's double backward and 16 for influence's factors: not measured).
#: Rules not named get :data:`DEFAULT` (the tables and figures: 190-290 MB there).
DEFAULT = Memory(base_mb=250, per_sample=200)
RULES: dict[str, Memory] = {
    "prepare_data": Memory(base_mb=400, input_copies=1),
    "evaluate_checkpoint": Memory(base_mb=530, per_sample=200, model_copies=8),
    "features_epoch": Memory(base_mb=510, per_sample=1500, model_copies=8),
    "ablation_epoch": Memory(base_mb=780, per_sample=200, model_copies=8),
    "ablation_part": Memory(base_mb=780, per_sample=200, model_copies=8),
    "probes_epoch": Memory(base_mb=530, per_sample=1000),
    "curvature_shard": Memory(base_mb=400, per_sample=300, model_copies=12),
    "curvature_epoch": Memory(base_mb=200, input_copies=3),
    "sample_outputs_shard": Memory(base_mb=490, per_sample=500, model_copies=8),
    "sample_outputs": Memory(base_mb=200, input_copies=1),
    "sample_dossier": Memory(base_mb=200, per_sample=1000),
    "sample_explorer": Memory(base_mb=240, per_sample=1000),
    "sample_thumbnails": Memory(base_mb=200, per_sample=100),
    "poison_detection": Memory(base_mb=200, per_sample=1500),
}
#: Influence: the model, its gradients and each layer's Kronecker factors and eigenvectors in
#: float64 (past a few GB, layer groups bound them: influence_cap); the (queries x transforms, N)
#: scores, float64 then float32 (scale.py --stages influence, N = 20,000, 1,000 and 5,000 queries:
#: +15.9 B a query and sample of the shape, 18 asked); their readers widen them (+24 B, 26 asked).
#: Past ``pairwise_gb`` a store's are a summary, and so its readers' if every method is projected.
for _rule in ("covariances", "eigenbasis", "corrections", "factors", "score_shard", "scores"):
    RULES[f"influence_{_rule}"] = Memory(base_mb=710, per_sample=1000, model_copies=16, capped=True)
for _rule in ("score_shard", "scores", "store_scores"):
    RULES[f"influence_{_rule}"] = replace(RULES["influence_scores"], per_score=18)
RULES["influence_store_scores"] = replace(RULES["influence_store_scores"], summarised=True)
for _rule in ("poison_detection", "sample_dossier", "lds_tables"):
    RULES[_rule] = replace(RULES.get(_rule, DEFAULT), per_score=26, summarised=_rule != "lds_tables")
#: The store's shards write their rows as they go: a sample's positions, scale and loss stay. Its
#: curvature: the shards' sums and each layer's eigenvectors, (k_out k_in)² numbers a layer; trak's
#: one k² block, float64, in the Fisher's sums, their merge, eigendecomposition and inverse (the demo's
#: digits_noisy at trak_dim 2,048 and 8,192, max_rss: +16, +54 and +23 B a number; asked 20, 64, 28).
RULES["influence_store_shard"] = Memory(
    base_mb=710, per_sample=100, model_copies=16, capped=True, per_curvature=20
)
RULES["influence_store_eigen"] = Memory(base_mb=400, model_copies=4, capped=True, per_curvature=64)
RULES["influence_store_scores"] = replace(RULES["influence_store_scores"], per_curvature=28)
#: A text run's jobs import transformers and tokenizers (~200 MB more on the demo's polarity run).
TEXT_MB = 200


def rule_memory(rule: str) -> Memory:
    """The :class:`Memory` of ``rule`` (:data:`DEFAULT` for the rules not in :data:`RULES`)."""
    return RULES.get(rule, DEFAULT)


def mem_mb(rule: str, shape: RunShape, attempt: int = 1) -> int:
    """What a job of ``rule`` asks for on ``shape`` at its ``attempt`` (MB): the expected peak x
    :data:`HEADROOM` x the attempt."""
    return math.ceil(rule_memory(rule).peak_mb(shape) * HEADROOM * max(1, attempt))


def dataset_shape(path: str | Path) -> RunShape:
    """The samples of a ``dataset.h5`` (train and test), the bytes one takes (an image, a text
    run's token ids) and whether it is text, read from its arrays' shapes; an empty shape while
    the file does not exist yet or cannot be read. Read once per version of the file (a plan asks
    for every job)."""
    if not Path(path).is_file():
        return RunShape()
    stat = Path(path).stat()
    try:
        samples, sample_bytes, text = stored_sizes(str(path), stat.st_mtime_ns, stat.st_size)
        return RunShape(samples=samples, sample_bytes=sample_bytes, text=text)
    except (OSError, KeyError):  # damaged: the job's own read names the file and the fix
        return RunShape()


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(value)] if isinstance(value, str | os.PathLike) else [str(v) for v in value]


def job_shape(inputs: Mapping[str, Any]) -> RunShape:
    """The :class:`RunShape` of a job from its named inputs (``dataset``, or else ``dossier``,
    ``checkpoint(s)``, :data:`SIZED_INPUTS`), as they are now: files not yet made count as empty."""
    dataset, dossier = inputs.get("dataset"), inputs.get("dossier")
    data = dataset_shape(dataset) if dataset else RunShape(samples=dossier_rows(dossier) if dossier else 0)
    checkpoints = _files(inputs.get("checkpoint")) + _files(inputs.get("checkpoints"))
    return replace(
        data,
        model_bytes=max((model_bytes(p) for p in checkpoints), default=0),
        input_bytes=sum(
            held_bytes(p) if key == "source" else size(p)
            for key in SIZED_INPUTS
            for p in _files(inputs.get(key))
        ),
    )


def shard_share(wildcards: Any) -> float:
    """A job's share of the samples: 1 / its ``nshards`` wildcard (Snakemake's wildcards, as
    attributes), 1 for a job that is not a shard."""
    return 1 / int(getattr(wildcards, "nshards", None) or 1)


def job_mem_mb(
    rule: str,
    inputs: Mapping,
    attempt: int = 1,
    folder_bytes: int = 0,
    share: float = 1.0,
    run=None,
    method=None,
) -> int:
    """``mem_mb`` of a job of ``rule`` with these named inputs at its ``attempt``; ``folder_bytes``:
    what it reads whole of a data folder that is not among its inputs
    (:func:`~epochlens.memory_sources.data_folder_bytes`); ``share``: a shard job's share of the
    samples (1 / its shard count), what it holds per sample; ``run``: its run's config section;
    ``method``: its wildcard."""
    shape = influence_shape(job_shape(inputs), (run or {}).get("influence"), method)
    samples, input_bytes = math.ceil(shape.samples * share), shape.input_bytes + folder_bytes
    return mem_mb(rule, replace(shape, samples=samples, input_bytes=input_bytes), attempt)


def influence_shape(shape: RunShape, influence: Mapping[str, Any] | None, method=None) -> RunShape:
    """``shape`` with what a run's ``influence`` section sets of its jobs' memory: the model's
    cap (layer groups), the score columns (at most ``queries.max_count`` x the transforms),
    ``pairwise_gb`` where every method is projected (the config's; else, or unset: scores whole)
    and trak's curvature (a job of ``method`` trak)."""
    cap, influence = influence_cap(shape.model_bytes, influence), influence or {}
    columns = (influence.get("queries") or {}).get("max_count", 50) * len(influence.get("transforms") or [0])
    projected = set(influence.get("methods") or [None]) <= set(PROJECTED_METHODS)
    spec = influence.get("projection") or {}
    gb = spec.get("pairwise_gb", math.inf) if projected else math.inf
    k = spec.get("trak_dim", ProjectionSettings.trak_dim) if method == "trak" else 0
    return replace(shape, model_cap=cap, score_columns=columns, pairwise_gb=gb, curvature=k * k)


def describe(rule: str) -> str:
    """``rule``'s memory as a formula (MB, before the headroom): ``450 + 100 B x samples + ...``."""
    m = rule_memory(rule)
    terms = ((m.per_sample, " B x samples"), (m.model_copies, " x model"), (m.input_copies, " x input files"))
    terms += ((m.per_score, " B x samples x queries x transforms" + (" if whole" * m.summarised)),)
    terms += ((m.per_curvature, " B x trak_dim² (trak)"),)
    return " + ".join([f"{m.base_mb:g}"] + [f"{v:g}{unit}" for v, unit in terms if v])


def run_shapes(config: Mapping[str, Any], workdir: str | Path = ".") -> dict[str, RunShape]:
    """The shape of each of ``config``'s runs whose ``dataset.h5`` exists under ``workdir``: its
    samples, and the bytes of its last checkpoint of its first index where that exists."""
    from epochlens.config.inputs import checkpoint_path
    from epochlens.layout import RESULTS

    shapes = {}
    for name, run in config.get("runs", {}).items():
        dataset = Path(workdir) / RESULTS.dataset(name)
        if not dataset.is_file():
            continue
        indices, epochs = run.get("indices") or [0], run.get("epochs") or []
        ckpt = Path(workdir) / checkpoint_path(name, run, indices[0], epochs[-1]) if epochs else None
        shape = replace(dataset_shape(dataset), model_bytes=model_bytes(ckpt) if ckpt else 0)
        shapes[name] = influence_shape(shape, run.get("influence"))
    return shapes
