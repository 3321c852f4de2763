"""Rule ablation_epoch: change in accuracy and loss on old and new classes when each unit group
of one checkpoint is zero- or mean-ablated."""

import numpy as np

from epochlens.ablation.ablate import ablation_table
from epochlens.ablation.settings import AblationSettings
from epochlens.atomic import write_atomic
from epochlens.checkpoints import load_into
from epochlens.data import read_dataset
from epochlens.device import resolve_device
from epochlens.errors import ConfigError
from epochlens.models.networks import build_model
from epochlens.runner import log, run_step
from epochlens.schedule import schedule_from_config, task_at_epoch

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
    run, index, epoch = wc.run, int(wc.index), int(wc.epoch)
    data = read_dataset(inp.dataset)
    schedule = schedule_from_config(p.schedule, inp.class_order)
    active = schedule.active_classes(epoch)
    newest = int(task_at_epoch(epoch, schedule.epochs_per_task))
    new = active[schedule.task_of_class()[active] == newest]
    model = build_model(p.model, data.num_classes, data.train_images.shape[1])
    load_into(model, inp.checkpoint)

    split = p.ablation["split"]
    if split == "test":
        images, labels = data.normalized("test"), data.test_labels
    else:
        held = np.flatnonzero(data.holdout)
        if len(held) == 0:
            raise ConfigError(
                f"runs.{run}.ablation.split: holdout, but the data set has no holdout; set "
                f"runs.{run}.data.holdout_per_class or ablation.split: test."
            )
        images, labels = data.normalized("train", held), data.train_labels[held]
    reference = None
    if p.ablation["mean_samples"]:
        # Mean activations over training images the model was trained on (outside the holdout),
        # evenly spaced, at most mean_samples of them.
        pool = np.flatnonzero(~data.holdout & np.isin(data.train_labels, active))
        take = np.unique(np.linspace(0, len(pool) - 1, min(p.ablation["mean_samples"], len(pool))).round())
        reference = data.normalized("train", pool[take.astype(np.int64)])

    # Batch size and device do not change the results: read from the config, not params.
    execution = snakemake.config["runs"][run]["ablation"]
    settings = AblationSettings(**p.ablation["settings"], batch_size=execution["batch_size"])
    device = resolve_device(snakemake.config["device"])
    log.info(
        "epoch %d: %d active classes (%d new), %d %s images, %s reference images, on %s",
        epoch,
        len(active),
        len(new),
        len(labels),
        split,
        "no" if reference is None else len(reference),
        device,
    )
    table = ablation_table(
        model,
        images,
        labels,
        active,
        new,
        settings,
        reference_images=reference,
        context={"run": run, "index": index, "epoch": epoch, "split": split},
        device=device,
        progress=True,
    )
    write_atomic(snakemake.output.table, lambda path: table.to_csv(path, index=False))
    whole = table[(table["group"] == "all") & (table["cohort"] != "all")]
    for row in whole.itertuples():
        log.info("%s %s-ablated: %s accuracy %+.3f", row.block, row.mode, row.cohort, row.delta_accuracy)


run_step(main, snakemake.log[0])
