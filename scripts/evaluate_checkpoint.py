"""Rule evaluate_checkpoint: per-class accuracy of one checkpoint on the test set and the holdout."""

from epochlens.atomic import write_atomic
from epochlens.checkpoints import load_into
from epochlens.data import read_dataset
from epochlens.device import resolve_device
from epochlens.evaluation import evaluate_checkpoint
from epochlens.models.networks import build_model
from epochlens.runner import log, run_step
from epochlens.schedule import schedule_from_config

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    run = snakemake.params.run
    epoch = int(snakemake.wildcards.epoch)
    data = read_dataset(snakemake.input.dataset)
    schedule = schedule_from_config(run["schedule"], snakemake.input.class_order)
    model = build_model(run["model"]["name"], data.num_classes, data.train_images.shape[1])
    load_into(model, snakemake.input.checkpoint)
    device = resolve_device(snakemake.config["device"])
    table = evaluate_checkpoint(model, data, schedule, epoch, run["evaluation"]["batch_size"], device)
    table.insert(0, "index", int(snakemake.wildcards.index))
    table.insert(0, "run", snakemake.wildcards.run)
    write_atomic(snakemake.output.table, lambda p: table.to_csv(p, index=False))
    test = table[table["split"] == "test"]
    log.info(
        "epoch %d: %d active classes, test accuracy %.3f",
        epoch,
        schedule.num_active(epoch),
        test["n_correct"].sum() / max(test["n"].sum(), 1),
    )


run_step(main, snakemake.log[0])
