"""Influence (EK-FAC) and ablation of Mistral-shaped causal LMs as their layers grow: each job's peak
memory beside ``epochlens plan``'s prediction (epochlens.scale_plan), and its seconds, with the
factors in one group and in layer groups (influence.factor_memory_gb). ``ablation`` runs an
ablation job's passes (the means, the intact pass, the first units zero- and mean-ablated).

Each case runs in a process of its own (its peak is that process's ``ru_maxrss``), as the
workflow's jobs do: ``factors`` fits the factors a group at a time and writes them
(``save_factor_groups``, as scripts/influence_factors.py), ``scores`` reads them back a group at a
time and computes self-influence and the influence of the training prompts on the queries. The
model is built from a ``MistralConfig`` (random weights, float32: what a checkpoint of that shape
costs), the prompts are random tokens, the loss is the language-model task's.

    PYTHONPATH=src .venv/bin/python benchmarks/large_models.py [--layers 4 8] [--budgets 4 0.5]
        [--hidden 512 --mlp 1792 --heads 8 --kv-heads 2] [--train 160 --queries 40 --length 32]
        [--query-memory 2] [--factor-batch 64] [--ablation-batch 256] [--jobs factors scores ablation]

Prints one row per (layers, budget, job) and, per budget, the ratio of the peaks at the most
layers to the fewest.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset


class Prompts(Dataset):
    """Random token prompts, every token a target (the language-model task shifts them)."""

    def __init__(self, n: int, length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def mistral(a: argparse.Namespace, layers: int) -> dict:
    """The config.json mapping of the case's Mistral-shaped model."""
    return {
        "model_type": "mistral", "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.mlp,
        "num_hidden_layers": layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "max_position_embeddings": a.length, "tie_word_embeddings": False,
    }  # fmt: skip


def model(a: argparse.Namespace) -> torch.nn.Module:
    import transformers

    from epochlens.formats.user_model import attach_output_adapter
    from epochlens.models.hf import load_config

    torch.manual_seed(0)
    net = transformers.MistralForCausalLM(load_config(mistral(a, a.n_layers), "causal_lm")).eval()
    attach_output_adapter(net, "logits")  # as a job's model returns its logits
    return net


def settings(a: argparse.Namespace):
    from epochlens.ablation.settings import AblationSettings
    from epochlens.influence import InfluenceSettings

    # Batches no larger than the data: the plan counts a full batch's activations.
    influence = InfluenceSettings(
        method="ekfac", factor_memory_gb=a.budget, query_memory_gb=a.query_memory, train_batch_size=8,
        factor_batch_size=min(a.factor_batch, a.train), query_batch_size=min(16, a.queries),
    )  # fmt: skip
    return influence, AblationSettings(channel_groups=4, batch_size=a.ablation_batch)


def predicted(a: argparse.Namespace, layers: int, budget: float) -> dict[str, float]:
    """Each job's peak as ``epochlens plan`` predicts it (MB)."""
    from epochlens import scale_plan

    influence, ablation = settings(argparse.Namespace(**{**vars(a), "budget": budget}))  # a stays as given
    shape = scale_plan.model_shape(mistral(a, layers), "causal_lm", a.length)
    jobs = scale_plan.influence_jobs(shape, "ekfac", influence, a.queries)
    out = {rule.removeprefix("influence_"): peak / 1e6 for rule, (peak, _) in jobs.items()}
    return {**out, "ablation": scale_plan.ablation_job(shape, ablation)[0] / 1e6}


def ablation(net: torch.nn.Module, a: argparse.Namespace, ablate) -> None:
    """An ablation job's passes: the sites' means, the baseline, the first units zero- and
    mean-ablated (every unit's passes hold the same)."""
    from epochlens.ablation.ablate import per_sample_outcome
    from epochlens.ablation.heads import ablated_units, site_means, text_units
    from epochlens.in_place import evaluated

    data = Prompts(ablate.batch_size, a.length, a.vocab, 2).ids  # one full batch a pass
    inputs, cpu = {"input_ids": data, "attention_mask": torch.ones_like(data)}, torch.device("cpu")
    with evaluated(net, cpu):
        units = text_units(net, ablate)
        batches = (
            {k: v[i : i + ablate.batch_size] for k, v in inputs.items()} for i in range(0, len(data), 64)
        )
        means = site_means(net, batches, sorted({u.site for u in units}))
        per_sample_outcome(net, inputs, data.numpy(), [0], ablate.batch_size, cpu)
        for unit in units[:4]:
            for mode in ablate.modes:
                with ablated_units(net, unit, mode, means):
                    per_sample_outcome(net, inputs, data.numpy(), [0], ablate.batch_size, cpu)


def child(a: argparse.Namespace) -> dict:
    """One job of one case, in this process: its seconds, layer groups and peak memory."""
    import importlib

    from snakemake import script  # noqa: F401 (a job's preamble imports it: part of its peak)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    importlib.import_module(SCRIPTS[a.job])  # what the job's script imports: part of its peak too

    from epochlens.influence import fit_factors, pairwise_influence, self_influence
    from epochlens.influence.factor_groups import (
        factor_groups,
        group_settings,
        plan_groups,
        save_factor_groups,
    )
    from epochlens.influence.layer_selection import select_layers
    from epochlens.tasks import LanguageModelTask

    torch.set_num_threads(a.threads)
    net, task = model(a), LanguageModelTask()
    settings, ablate = globals()["settings"](a)
    train = Prompts(a.train, a.length, a.vocab, 1)
    start = time.perf_counter()
    names = plan_groups(select_layers(net), "ekfac", a.budget)
    if a.job == "ablation":
        ablation(net, a, ablate)
    elif a.job == "factors":
        groups = (
            fit_factors(net, train, settings=group_settings(settings, g), key={}, task=task) for g in names
        )
        save_factor_groups(a.path, groups, names, {})
    else:
        queries = Prompts(a.queries, a.length, a.vocab, 2)
        for factors in factor_groups(a.path):
            spec = group_settings(settings, list(factors.layers))
            self_influence(net, factors, train, settings=spec, task=task)
            pairwise_influence(net, factors, train, None, queries, None, settings=spec, task=task)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": round(seconds, 1), "groups": len(names), "peak_mb": round(peak)}


def run_case(a: argparse.Namespace, layers: int, budget: float, job: str, path: Path) -> dict:
    argv = [sys.executable, __file__, "--child", job, "--n-layers", str(layers), "--budget", str(budget)]
    argv += ["--path", str(path)] + [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in SHAPE]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{job} at {layers} layers failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


SHAPE = (
    "hidden",
    "mlp",
    "heads",
    "kv_heads",
    "vocab",
    "train",
    "queries",
    "length",
    "threads",
    "query_memory",
    "ablation_batch",
    "factor_batch",
)


def cases(a: argparse.Namespace) -> list[tuple[int, float, str]]:
    """(layers, factor_memory_gb, job) to run: influence at every budget, ablation once per depth."""
    out = []
    for layers in a.layers:
        out += [(layers, b, job) for b in a.budgets for job in ("factors", "scores") if job in a.jobs]
        out += [(layers, a.budgets[0], "ablation")] if "ablation" in a.jobs else []
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    p.add_argument("--budgets", type=float, nargs="+", default=[4.0, 0.5], help="factor_memory_gb values")
    for name, default in (("hidden", 512), ("mlp", 1792), ("heads", 8), ("kv-heads", 2), ("vocab", 1000)):
        p.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("train", 160), ("queries", 40), ("length", 32), ("threads", 2)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--ablation-batch", type=int, default=256, help="ablation.batch_size")
    p.add_argument("--factor-batch", type=int, default=64, help="influence.factor_batch_size")
    p.add_argument("--query-memory", type=float, default=2.0, help="query_memory_gb (GiB of held queries)")
    p.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS, help="which jobs to measure")
    p.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    p.add_argument("--child", choices=JOBS, help=argparse.SUPPRESS)
    p.add_argument("--n-layers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    p.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    return p


JOBS = ("factors", "scores", "ablation")
SCRIPTS = {"factors": "influence_factors", "scores": "influence_scores", "ablation": "ablation_epoch"}


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.child:
        a.job = a.child
        print(json.dumps(child(a)))
        return 0
    shape = f"hidden {a.hidden}, MLP {a.mlp}, heads {a.heads}/{a.kv_heads}, vocab {a.vocab}"
    print(
        f"Mistral-shaped LM ({shape}), EK-FAC, {a.train} training prompts, {a.queries} queries of {a.length}"
        f" tokens, query_memory_gb {a.query_memory:g}; predicted: epochlens plan's prediction"
    )
    print("layers | factor_memory_gb | job | groups | peak MB | predicted MB | predicted / peak | seconds")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers, budget, job in cases(a):
            r = run_case(a, layers, budget, job, Path(tmp) / f"factors-{layers}-{budget}.pt")
            r.update(
                layers=layers, budget=budget, job=job, predicted_mb=round(predicted(a, layers, budget)[job])
            )
            rows.append(r)
            print(
                f"{layers} | {budget:g} | {job} | {r['groups']} | {r['peak_mb']:,} | {r['predicted_mb']:,} | "
                f"{r['predicted_mb'] / r['peak_mb']:.2f} | {r['seconds']}"
            )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    lo, hi = min(a.layers), max(a.layers)
    for budget, job in sorted({(r["budget"], r["job"]) for r in rows}):
        by_layers = {r["layers"]: r["peak_mb"] for r in rows if (r["budget"], r["job"]) == (budget, job)}
        if lo != hi:
            ratio = by_layers[hi] / by_layers[lo]
            print(f"factor_memory_gb {budget:g}, {job}: peak at {hi} layers / {lo} = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
