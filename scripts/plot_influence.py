"""Rule plot_influence: ROC curves per method, the top-ranked training images, per-layer conditioning."""

import pandas as pd

from epochlens.data import read_dataset
from epochlens.plotting.common import (
    plot_influence_conditioning,
    plot_poison_roc,
    plot_top_influential_images,
    save_figure,
)
from epochlens.runner import run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    inp, out, run = snakemake.input, snakemake.output, snakemake.wildcards.run
    detection = pd.read_csv(inp.detection)
    data = read_dataset(inp.dataset)
    kind = snakemake.params.corruption["kind"]
    title = run if kind == "none" else f"{run} ({kind.replace('_', ' ')})"
    figures = {
        "roc": plot_poison_roc(pd.read_csv(inp.roc), detection, title),
        "top": plot_top_influential_images(
            pd.read_csv(inp.top), detection, data.train_images, data.scale, title, data.class_names
        ),
        "conditioning": plot_influence_conditioning(pd.read_csv(inp.conditioning), title),
    }
    for name, fig in figures.items():
        save_figure(fig, [out[f"{name}_png"], out[f"{name}_pdf"]])


run_step(main, snakemake.log[0])
