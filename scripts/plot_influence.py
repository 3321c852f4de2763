"""Rule plot_influence: ROC curves per method, the top-ranked training images (a text run: texts),
per-layer conditioning.

By hand, from the run's working directory: python scripts/plot_influence.py run=digits_noisy
"""

import _no_pyarrow  # noqa: F401  (first: pandas without pyarrow, see the module)
import numpy as np
import pandas as pd
from _helpers import run_script

from epochlens.data.text import TextDataset
from epochlens.data.text_rows import open_any_dataset, stored_strings
from epochlens.plotting.common import save_figure
from epochlens.plotting.influence import (
    plot_influence_conditioning,
    plot_poison_roc,
    plot_top_influential_images,
    plot_top_influential_texts,
)


def targets_of(top: pd.DataFrame) -> dict[int, str]:
    """A regression's top-ranked samples' targets as text (the top table's ``target`` column)."""
    return {int(row.sample): f"y={row.target}" for row in top.itertuples(index=False)}


def texts_of(dataset, top: pd.DataFrame) -> dict[int, str]:
    """The texts of the top-ranked training samples, read for those rows alone."""
    rows = np.unique(top["sample"].to_numpy(np.int64))
    return dict(zip(rows.tolist(), stored_strings(dataset, "train/text", rows) or [], strict=False))


def main(snakemake) -> None:
    inp, out, run = snakemake.input, snakemake.output, snakemake.wildcards.run
    detection = pd.read_csv(inp.detection)
    data = open_any_dataset(inp.dataset)
    corruption = snakemake.params.corruption
    kind, phrase = corruption["kind"], corruption.get("phrase")
    title = run if kind == "none" else f"{run} ({kind.replace('_', ' ')}{f' {phrase!r}' if phrase else ''})"
    top = pd.read_csv(inp.top)
    regression = getattr(data, "is_regression", False)
    # One figure at a time (built, saved, closed): the job's peak memory is that of the largest.
    figures = {
        "roc": lambda: plot_poison_roc(pd.read_csv(inp.roc), detection, title),
        "top": lambda: (
            plot_top_influential_texts(top, detection, texts_of(inp.dataset, top), title, data.class_names)
            if isinstance(data, TextDataset)
            else plot_top_influential_texts(top, detection, targets_of(top), title)
            if regression
            else plot_top_influential_images(
                top, detection, data.train_images, data.scale, title, data.class_names
            )
        ),
        "conditioning": lambda: plot_influence_conditioning(pd.read_csv(inp.conditioning), title),
    }
    for name, build in figures.items():
        save_figure(build(), [out[f"{name}_png"], out[f"{name}_pdf"]])


if __name__ == "__main__":
    run_script(main, "plot_influence", globals().get("snakemake"))
