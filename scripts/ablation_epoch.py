"""Rules ablation_epoch and ablation_part: change in accuracy and loss on old and new classes when
each unit group of one checkpoint is zero- or mean-ablated (text: each head and MLP neuron group);
with ablation.parts above 1 each ablation_part job ablates a block of them, ablation_epoch merges.

By hand, from the run's working directory:
    python scripts/ablation_epoch.py run=digits index=0 epoch=0030
"""

import pandas as pd
from _helpers import execution, job_files, run_script

from epochlens.ablation.ablate import ablation_table, evaluation_images, reference_images
from epochlens.ablation.heads import head_ablation_table
from epochlens.ablation.settings import AblationSettings
from epochlens.atomic import write_atomic
from epochlens.data.text import TextDataset
from epochlens.job import load_checkpoint_job
from epochlens.runner import log


def main(snakemake) -> None:
    p, wc = snakemake.params, snakemake.wildcards
    if snakemake.input.get("parts"):  # ablation.parts > 1: this checkpoint's table is theirs in order
        tables = [pd.read_csv(path) for path in snakemake.input.parts]  # floats read back exactly
        write_atomic(snakemake.output.table, lambda path: pd.concat(tables).to_csv(path, index=False))
        return
    job = load_checkpoint_job(model=p.model, schedule=p.schedule, **job_files(snakemake))
    split = p.ablation["split"]
    # Batch size, parts and device do not change the results: read from the config, not params.
    part = {"part": int(wc.get("part", 0)), "parts": int(wc.get("nparts", 1))}  # rule ablation_part
    batch = execution(snakemake, "ablation")["batch_size"]
    settings = AblationSettings(**p.ablation["settings"], batch_size=batch, **part)
    context = {"run": wc.run, "index": int(wc.index), "epoch": job.epoch, "split": split}
    if isinstance(job.data, TextDataset):
        log.info(
            "epoch %d: heads and MLP neuron groups on the %s sentences, on %s", job.epoch, split, job.device
        )
        args = (
            job.data,
            split,
            job.active,
            job.new,
            settings,
            p.ablation["mean_samples"],
            context,
            job.device,
        )
        table = head_ablation_table(job.model, *args)
        write_atomic(snakemake.output.table, lambda path: table.to_csv(path, index=False))
        return
    images, labels = evaluation_images(job.data, split, wc.run)
    reference = reference_images(job.data, job.active, p.ablation["mean_samples"])
    reduction = p.ablation.get("reduction")  # a regression's squared error
    classes = "regression" if reduction else f"{len(job.active)} active classes ({len(job.new)} new)"
    log.info(
        "epoch %d: %s, %d %s samples, %s reference samples, on %s",
        job.epoch, classes, len(labels), split, "no" if reference is None else len(reference), job.device,
    )  # fmt: skip
    table = ablation_table(
        job.model,
        images,
        labels,
        job.active,
        job.new,
        settings,
        reference,
        context,
        job.device,
        progress=True,
        reduction=reduction,
    )
    write_atomic(snakemake.output.table, lambda path: table.to_csv(path, index=False))
    whole = table[(table["group"] == "all") & ((table["cohort"] != "all") | bool(reduction))]
    for row in whole.itertuples():
        change = f"loss {row.delta_loss:+.4g}" if reduction else f"accuracy {row.delta_accuracy:+.3f}"
        log.info("%s %s-ablated: %s %s", row.block, row.mode, row.cohort, change)


if __name__ == "__main__":
    run_script(main, "ablation_epoch", globals().get("snakemake"))
