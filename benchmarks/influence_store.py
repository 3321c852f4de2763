"""Benchmark: the projected-gradient store (method logra) beside EK-FAC, and at a million samples.

``compare`` (default): on ResNet-18 (``--model resnet18_lop``: random CIFAR-shaped inputs, 100
classes, 50 active), the small CNN (``small_cnn``, 1x8x8), a tiny GPT-2 or BERT classifier
(``tiny_gpt2``, ``tiny_bert``: benchmarks/influence.py's, random token sequences) or a Mistral-shaped
causal LM (``mistral``: ``--layers`` decoder layers of hidden 512, MLP 1792, random prompts of 32
tokens, the language-model task), N training samples and Q queries, the curvature from ``--fisher``,
the influence jobs of each method as the workflow runs them:

* ``ekfac``: the factors (covariances, eigendecomposition, corrections: two passes) and the scores
  (self-influence and the influence on the queries: ceil(Q / held) passes over the training set);
* ``logra``: the store (one pass: each sample's projected loss gradient written to disk, the
  projected Gauss-Newton sums of the Fisher's), its curvature (eigendecomposed once), then the
  scores (the curvature damped, the queries' gradients, one read of the store);
* ``logra_requery``: Q other queries scored against the kept store and curvature (what a new query
  set costs: the ``influence_store_scores`` job alone).
* ``trak`` and ``trak_requery`` (``--trak-dim K``): the same three jobs and a new query set for
  TRAK's projection of the whole gradient to K numbers (influence/whole_projection.py), printed
  beside: trak / ekfac, trak / logra and the Spearman correlations of its scores with EK-FAC's.
* ``kronfluence`` (``--kronfluence PYTHON``, the image models and the text classifiers; with
  ``--fisher empirical`` the EK-FAC side matches it): kronfluence 1.0.1's EK-FAC in its own
  environment (benchmarks/_kronfluence.py, as ``benchmarks/influence.py --kronfluence`` runs it:
  empirical Fisher, float64, ``--kf-query-batch-size`` queries held) on the same weights, training
  samples and first queries, its five stages in a row; its seconds are the subprocess's wall time
  and its peak the largest its driver reports. Printed beside: logra / kronfluence and the Spearman
  correlations of logra's and EK-FAC's scores with kronfluence's.

The three are interleaved (A B C, C B A, ...; ``--repeats`` rounds, the fastest of each kept), each
with its peak memory (the increase of the process's peak RSS during it). Printed: seconds, the
ratios logra / ekfac and logra_requery / logra, peak MiB, and the Spearman correlation of logra's
pairwise and self-influence with EK-FAC's (mean over queries; all of them flattened).

``scale``: the small CNN on N in ``--sizes`` random 1x8x8 images (each size in a process of its own:
its peak is that process's ``ru_maxrss``), Q queries: the store's seconds a sample and bytes on disk,
and what influence_store_scores computes when the (Q, N) scores are too large to keep
(store_summary.store_summary: self-influence, each sample's reductions over the queries, the exact
top-k (``--top-k``) of every query over the store and of every sample over the queries; two reads
of the store, memory a chunk and (Q + N) x k, not Q x N): seconds and the peak. Memory flat in N is
the claim it checks. ``--faiss``: the same neighbours from faiss's exact inner-product index
(faiss-cpu on PYTHONPATH), which holds the store in memory.

    PYTHONPATH=src .venv/bin/python benchmarks/influence_store.py --model mistral --layers 8 \\
        --n-train 160 --n-query 40
    PYTHONPATH=src .venv/bin/python benchmarks/influence_store.py --scale --sizes 10000 100000 1000000 \\
        --n-query 1000 --dtype float16
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import _common
import numpy as np
import torch
from scipy.stats import spearmanr

from epochlens.influence import InfluenceSettings, fit_factors, pairwise_influence, self_influence
from epochlens.influence.covariances import resolve_layers
from epochlens.influence.gradient_store import GradientStore, ShardInfo, StoreWriter, store_scores
from epochlens.influence.projected_basis import projected_basis
from epochlens.influence.projected_curvature import projected_curvature
from epochlens.influence.projection import project_samples, projection_pass
from epochlens.influence.projection_settings import ProjectionSettings
from epochlens.influence.store_summary import store_summary
from epochlens.models.networks import build_model
from epochlens.tasks import LanguageModelTask

SHAPES = {"small_cnn": (1, 8, 10, 5), "resnet18_lop": (3, 32, 100, 50)}
TEXT_CLASSIFIERS = ("tiny_bert", "tiny_gpt2")  # benchmarks/influence.py's: two-class, random tokens


class Case:
    """Model, task, training data and two query sets of the comparison."""

    def _labels(self, n: int, gen: torch.Generator) -> np.ndarray:
        return torch.randint(0, len(self.active), (n,), generator=gen).numpy()

    def __init__(self, a: argparse.Namespace) -> None:
        gen = torch.Generator().manual_seed(0)
        if a.model == "mistral":
            import large_models

            shape = argparse.Namespace(
                vocab=1000, hidden=512, mlp=1792, heads=8, kv_heads=2, length=32, n_layers=a.layers
            )
            self.net, self.task, self.active = large_models.model(shape), LanguageModelTask(), None
            self.x, self.y = large_models.Prompts(a.n_train, 32, 1000, 1), None
            self.queries = [(large_models.Prompts(a.n_query, 32, 1000, s), None) for s in (2, 3)]
        elif a.model in TEXT_CLASSIFIERS:  # benchmarks/influence.py's inputs: random token sequences
            from influence import _data, _inputs, _model

            inputs = [
                _inputs(a.model, argparse.Namespace(seed=s, n_train=a.n_train, n_query=a.n_query))
                for s in (0, 1)
            ]
            self.inputs, self.net, self.task = inputs[0], _model(inputs[0], torch.device("cpu")), None
            self.x, self.y, xq, yq, self.active = _data(inputs[0])
            self.queries = [(xq, yq), _data(inputs[1])[2:4]]
        else:
            channels, side, classes, active = SHAPES[a.model]
            torch.manual_seed(0)
            self.net, self.task = build_model(a.model, classes, channels).eval(), None
            self.active = np.arange(active)
            self.x = torch.randn(a.n_train, channels, side, side, generator=gen)
            self.y = torch.randint(0, active, (a.n_train,), generator=gen).numpy()
            self.queries = [
                (torch.randn(a.n_query, channels, side, side, generator=gen), self._labels(a.n_query, gen))
                for _ in range(2)
            ]
        batches = {"train_batch_size": a.batch, "factor_batch_size": a.batch, "query_batch_size": a.n_query}
        self.settings = InfluenceSettings(method="identity", fisher=a.fisher, **batches)
        self.projection = ProjectionSettings(dim=a.dim, dtype=a.dtype, precondition=a.precondition)


def ekfac(c: Case) -> tuple[np.ndarray, np.ndarray]:
    s = InfluenceSettings(**{**vars(c.settings), "method": "ekfac"})
    factors = fit_factors(c.net, c.x, c.y, c.active, s, task=c.task)
    own = self_influence(c.net, factors, c.x, c.y, c.active, s, task=c.task).scores
    pair = pairwise_influence(c.net, factors, c.x, c.y, *c.queries[0], c.active, s, task=c.task).scores
    return pair, own


def write_store(c: Case, folder: Path, projection: ProjectionSettings) -> GradientStore:
    """The store of the training samples in one shard, as an influence_store_shard job writes it."""
    layers = projection_pass(projection).layout(resolve_layers(c.net, c.settings), projection)
    width, n, name = sum(r[3] * r[4] for r in layers), len(c.x), "trak" if projection.whole else "store"
    with StoreWriter(folder / f"{name}.npy", n, width, projection.dtype) as writer:
        r = project_samples(
            c.net, c.x, c.y, settings=c.settings, projection=projection, active_classes=c.active,
            task=c.task, write=writer,
        )  # fmt: skip
    info = ShardInfo(np.arange(n), r.scales, r.losses, r.usable, layers, r.fisher, r.n_fisher, [], [], {}, {})
    info.save(folder / f"{name}.pt")
    return GradientStore([(folder / f"{name}.npy", folder / f"{name}.pt")])


def store_basis(c: Case, store: GradientStore):
    """An influence_store_curvature job: the store's projected curvature eigendecomposed once."""
    sums, n = store.fisher()
    return projected_basis(sums, n, store.infos[0].layers, c.projection.precondition)


def score_store(
    c: Case, store: GradientStore, basis, queries, projection=None
) -> tuple[np.ndarray, np.ndarray]:
    """An influence_store_scores job: the damped curvature, the queries' projected gradients, one read."""
    curvature = projected_curvature(basis, c.settings)
    q = np.full((len(queries[0]), store.width), np.nan)
    project_samples(
        c.net, *queries, q, settings=c.settings, projection=projection or c.projection, mode="measurement",
        curvature=False, active_classes=c.active, task=c.task,
    )  # fmt: skip
    return store_scores(store, curvature, curvature.apply(q))


def _first_run(c: Case, folder: Path, projection: ProjectionSettings, kept: dict):
    """The store, its curvature, the scores: the three jobs of a first run (kept for the requery)."""
    kept["store"] = write_store(c, folder, projection)
    kept["basis"] = store_basis(c, kept["store"])
    return score_store(c, kept["store"], kept["basis"], c.queries[0], projection)


def _spearman(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(mean over rows, flattened) Spearman correlation of two (Q, N) score matrices."""
    rows = [spearmanr(x, y).statistic for x, y in zip(a, b, strict=True)]
    return float(np.mean(rows)), float(spearmanr(a.ravel(), b.ravel()).statistic)


def compare(a: argparse.Namespace) -> dict:
    torch.set_num_threads(a.threads)
    c, device = Case(a), torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        folder, kept, trak = Path(tmp), {}, {}
        sides = {
            "ekfac": lambda: ekfac(c),
            "logra": lambda: _first_run(c, folder, c.projection, kept),
            "logra_requery": lambda: score_store(c, kept["store"], kept["basis"], c.queries[1]),
        }
        if a.trak_dim:  # TRAK's projection of the whole gradient, preconditioned by the whole curvature
            whole = replace(c.projection, trak_dim=a.trak_dim, whole=True)
            sides["trak"] = lambda: _first_run(c, folder, whole, trak)
            sides["trak_requery"] = lambda: score_store(c, trak["store"], trak["basis"], c.queries[1], whole)
        kf = _kronfluence_side(c, a, folder, sides) if a.kronfluence else None
        try:
            seconds, results, peaks = _common.interleaved(sides, a.repeats, device, memory=True)
        finally:
            if kf is not None:
                kf.close()
        disk = (folder / "store.npy").stat().st_size
    (ek_pair, ek_self), (lg_pair, lg_self) = results["ekfac"], results["logra"]
    report = {
        "model": a.model, "layers": a.layers if a.model == "mistral" else None, "n_train": a.n_train,
        "n_query": a.n_query, "projection": vars(c.projection), "seconds": seconds, "peak_mib": peaks,
        "logra_over_ekfac": seconds["logra"] / seconds["ekfac"],
        "requery_over_logra": seconds["logra_requery"] / seconds["logra"],
        "spearman_pairwise": _spearman(lg_pair, ek_pair),
        "spearman_self": float(spearmanr(lg_self, ek_self).statistic), "store_bytes": disk,
    }  # fmt: skip
    if a.trak_dim:
        tr_pair, tr_self = results["trak"]
        report.update(
            trak_over_ekfac=seconds["trak"] / seconds["ekfac"],
            trak_over_logra=seconds["trak"] / seconds["logra"],
            trak_spearman_pairwise=_spearman(tr_pair, ek_pair),
            trak_spearman_self=float(spearmanr(tr_self, ek_self).statistic),
        )  # fmt: skip
    if kf is not None:
        kf_pair, kf_self = results["kronfluence"]
        report["peak_mib"]["kronfluence"] = kf.peak_mib
        report["logra_over_kronfluence"] = seconds["logra"] / seconds["kronfluence"]
        report["ekfac_over_kronfluence"] = seconds["ekfac"] / seconds["kronfluence"]
        for name, (pair, own) in (("logra", (lg_pair, lg_self)), ("ekfac", (ek_pair, ek_self))):
            report[f"spearman_{name}_kronfluence"] = {
                "pairwise": _spearman(pair, kf_pair),
                "self": float(spearmanr(own, kf_self).statistic),
            }
    return report


def _kronfluence_side(c: Case, a: argparse.Namespace, folder: Path, sides: dict):
    """kronfluence's EK-FAC as a side of the comparison: its driver started on the case's inputs."""
    from influence import _Kronfluence

    if a.model not in [*SHAPES, *TEXT_CLASSIFIERS]:
        raise SystemExit("influence_store.py: --kronfluence runs on the image models and text classifiers")
    inputs = c.inputs if a.model in TEXT_CLASSIFIERS else {
        "model": a.model, "num_classes": SHAPES[a.model][2], "state_dict": c.net.state_dict(),
        "x": c.x, "y": c.y, "xq": c.queries[0][0], "yq": c.queries[0][1], "active": c.active,
    }  # fmt: skip
    torch.save(inputs, folder / "inputs.pt")
    args = argparse.Namespace(batch_size=a.batch, kf_query_batch_size=a.kf_query_batch_size)
    args.threads = a.threads
    kf = _Kronfluence(a.kronfluence, folder, args, torch.device("cpu"))
    kf.peak_mib = 0.0

    def run():  # the factors, then self-influence and the queries' influence, as a first run
        for stage in ("covariance", "eigendecomposition", "lambda", "self", "pairwise"):
            kf.peak_mib = max(kf.peak_mib, kf.run(stage).get("peak_mib", 0.0))
        return np.load(folder / "kf_pairwise.npy"), np.load(folder / "kf_self.npy")

    sides["kronfluence"] = run
    return kf


def scale_child(a: argparse.Namespace) -> dict:
    """One size of the scale run, in this process: store, then the exact top-k of the queries."""
    torch.set_num_threads(a.threads)
    a.model = "small_cnn"
    c = Case(argparse.Namespace(**{**vars(a), "n_train": 1}))
    gen = torch.Generator().manual_seed(1)
    c.x = torch.randn(a.n_train, 1, 8, 8, generator=gen)  # in-memory inputs: 256 B a sample
    c.y = torch.randint(0, 5, (a.n_train,), generator=gen).numpy()
    folder = Path(a.path)
    t0 = time.perf_counter()
    store = write_store(c, folder)
    t1 = time.perf_counter()
    curvature = projected_curvature(store_basis(c, store), c.settings)
    q = np.full((a.n_query, store.width), np.nan)
    project_samples(c.net, *c.queries[0], q, settings=c.settings, projection=c.projection, mode="measurement",
                    curvature=False, active_classes=c.active)  # fmt: skip
    pre = curvature.apply(q)
    t_summary = time.perf_counter()
    summary = store_summary(store, curvature, {"none": pre}, k=a.top_k)
    t2 = time.perf_counter()
    assert (summary.neighbours["top_train"][0] >= 0).all()
    row = {
        "n_train": a.n_train, "store_seconds": t1 - t0, "store_us_per_sample": 1e6 * (t1 - t0) / a.n_train,
        "store_bytes": (folder / "store.npy").stat().st_size + (folder / "store.pt").stat().st_size,
        "width": store.width, "query_seconds": t2 - t1, "summary_seconds": t2 - t_summary,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }  # fmt: skip
    if a.faiss:  # the same neighbours by faiss: an exact inner-product index of the store in memory
        row.update(faiss_neighbours(store, pre, a.top_k, summary))
    return row


def faiss_neighbours(store: GradientStore, pre: np.ndarray, k: int, summary) -> dict:
    """Each query's top-k over the store and each sample's over the queries by faiss's IndexFlatIP
    (the store added chunk by chunk; float32), the seconds and peak after it, and whether the
    neighbours are store_summary's."""
    import faiss

    t0 = time.perf_counter()
    index = faiss.IndexFlatIP(store.width)
    for _, g in store.chunks():
        index.add(np.ascontiguousarray(g, np.float32))
    _, per_query = index.search(np.ascontiguousarray(pre, np.float32), k)
    queries = faiss.IndexFlatIP(store.width)
    queries.add(np.ascontiguousarray(pre, np.float32))
    for _, g in store.chunks():
        queries.search(np.ascontiguousarray(g, np.float32), min(k, len(pre)))
    return {
        "faiss_seconds": time.perf_counter() - t0,
        "faiss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "faiss_same_top_query": float(np.mean(per_query == summary.neighbours["top_train"][0])),
    }


def scale(a: argparse.Namespace) -> list[dict]:
    rows = []
    for n in a.sizes:
        with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
            argv = [sys.executable, __file__, "--child", "--path", tmp, "--n-train", str(n)]
            for k in ("n_query", "top_k", "dim", "dtype", "precondition", "threads", "batch"):
                argv.append(f"--{k.replace('_', '-')}={getattr(a, k)}")
            argv += ["--faiss"] if a.faiss else []
            out = subprocess.run(argv, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"N = {n} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=[*SHAPES, *TEXT_CLASSIFIERS, "mistral"], default="small_cnn")
    p.add_argument("--fisher", choices=["true", "empirical"], default="true", help="influence.fisher")
    p.add_argument("--layers", type=int, default=8, help="decoder layers of --model mistral")
    p.add_argument("--n-train", type=int, default=256)
    p.add_argument("--n-query", type=int, default=40)
    p.add_argument("--batch", type=int, default=32, help="training and factor batch size")
    p.add_argument("--dim", type=int, default=32, help="influence.projection.dim")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--precondition", choices=["gauss_newton", "ekfac", "none"], default="gauss_newton")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--scale", action="store_true", help="the scale run (small CNN, --sizes)")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--faiss", action="store_true", help="--scale: also faiss's exact index (faiss-cpu)")
    p.add_argument("--tmp", help="folder of the scale run's stores (default: the system's temporary folder)")
    p.add_argument("--trak-dim", type=int, help="also trak (and a requery) at this projection.trak_dim")
    p.add_argument("--kronfluence", help="compare with kronfluence 1.0.1 run by this Python (its own venv)")
    p.add_argument("--kf-query-batch-size", type=int, default=40, help="queries kronfluence holds at once")
    p.add_argument("--json", type=Path, help="also write the report to this JSON file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.child:
        print(json.dumps(scale_child(a)))
        return 0
    report = scale(a) if a.scale else compare(a)
    if not a.scale:
        print(json.dumps(report, indent=1))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
