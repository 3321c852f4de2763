"""Influence (EK-FAC) of Mistral-shaped causal LMs as their layers grow: each job's peak memory and
seconds, with the factors in one group and in layer groups (influence.factor_memory_gb).

Each case runs in a process of its own (its peak is that process's ``ru_maxrss``), as the
workflow's jobs do: ``factors`` fits the factors a group at a time and writes them
(``save_factor_groups``, as scripts/influence_factors.py), ``scores`` reads them back a group at a
time and computes self-influence and the influence of the training prompts on the queries. The
model is built from a ``MistralConfig`` (random weights, float32: what a checkpoint of that shape
costs), the prompts are random tokens, the loss is the language-model task's.

    PYTHONPATH=src .venv/bin/python benchmarks/large_models.py [--layers 4 8] [--budgets 4 0.5]
        [--hidden 512 --mlp 1792 --heads 8 --kv-heads 2] [--train 160 --queries 40 --length 32]
        [--query-memory 2]

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


def model(a: argparse.Namespace) -> torch.nn.Module:
    import transformers

    config = transformers.MistralConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.mlp, num_hidden_layers=a.n_layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=a.length,
        tie_word_embeddings=False, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config).eval()


def child(a: argparse.Namespace) -> dict:
    """One job of one case, in this process: its seconds, layer groups and peak memory."""
    from epochlens.influence import InfluenceSettings, fit_factors, pairwise_influence, self_influence
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
    settings = InfluenceSettings(
        method="ekfac", factor_memory_gb=a.budget, train_batch_size=8, query_memory_gb=a.query_memory
    )
    train = Prompts(a.train, a.length, a.vocab, 1)
    start = time.perf_counter()
    names = plan_groups(select_layers(net), "ekfac", a.budget)
    if a.job == "factors":
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
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    p.add_argument("--budgets", type=float, nargs="+", default=[4.0, 0.5], help="factor_memory_gb values")
    for name, default in (("hidden", 512), ("mlp", 1792), ("heads", 8), ("kv-heads", 2), ("vocab", 1000)):
        p.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("train", 160), ("queries", 40), ("length", 32), ("threads", 2)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--query-memory", type=float, default=2.0, help="query_memory_gb (GiB of held queries)")
    p.add_argument("--child", choices=["factors", "scores"], help=argparse.SUPPRESS)
    p.add_argument("--n-layers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    p.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        a.job = a.child
        print(json.dumps(child(a)))
        return 0
    shape = f"hidden {a.hidden}, MLP {a.mlp}, heads {a.heads}/{a.kv_heads}, vocab {a.vocab}"
    print(
        f"Mistral-shaped LM ({shape}), EK-FAC, {a.train} training prompts, {a.queries} queries of {a.length}"
        f" tokens, query_memory_gb {a.query_memory:g}"
    )
    print("layers | factor_memory_gb | job | groups | peak MB | seconds")
    peaks: dict[tuple[float, str], dict[int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in a.layers:
            for budget in a.budgets:
                path = Path(tmp) / f"factors-{layers}-{budget}.pt"
                for job in ("factors", "scores"):
                    r = run_case(a, layers, budget, job, path)
                    peaks.setdefault((budget, job), {})[layers] = r["peak_mb"]
                    print(
                        f"{layers} | {budget:g} | {job} | {r['groups']} | {r['peak_mb']:,} | {r['seconds']}"
                    )
    lo, hi = min(a.layers), max(a.layers)
    for (budget, job), by_layers in peaks.items():
        ratio = by_layers[hi] / by_layers[lo]
        print(f"factor_memory_gb {budget:g}, {job}: peak at {hi} layers / {lo} layers = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
