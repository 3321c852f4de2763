"""Rule train_<run>: class-incremental training of one replicate, checkpoints at task boundaries
(a built-in network on images, or a text run's transformer built from model.hf.config).

By hand, from the run's working directory: python scripts/train.py run=digits index=0
"""

from pathlib import Path

from _helpers import job_resources, run_script

from epochlens.atomic import write_json
from epochlens.data.text_rows import read_any_dataset
from epochlens.device import job_device
from epochlens.layout import RESULTS, epoch_name
from epochlens.models.build import build_untrained
from epochlens.provenance import provenance
from epochlens.resume import clear as clear_resume_state
from epochlens.runner import log
from epochlens.schedule import schedule_from_config
from epochlens.training import TrainSettings, train_incremental


def main(snakemake) -> None:
    run = snakemake.params.run
    index = int(snakemake.wildcards.index)
    data = read_any_dataset(snakemake.input.dataset)
    schedule = schedule_from_config(run["schedule"], snakemake.input.class_order)
    settings = TrainSettings(**{**run["train"], "seed": run["train"]["seed"] + index})
    model = build_untrained(run["model"], data, settings.seed)
    folder = Path(snakemake.output.checkpoints[0]).parent
    # An execution setting (recorded, not a param), for a job given a GPU (the workflow asks for one).
    device = job_device(snakemake.config["device"], job_resources(snakemake))
    # Outside the outputs, which Snakemake deletes when the job fails (see epochlens.resume).
    resume_dir = RESULTS.resume_dir(snakemake.rule.removeprefix("train_"), index)  # rule train_<run>
    log.info(
        "training index %d on %s: %d tasks x %d epochs",
        index,
        device,
        schedule.num_tasks,
        schedule.epochs_per_task,
    )
    table = train_incremental(
        model,
        data,
        schedule,
        settings,
        checkpoint_path=lambda epoch: folder / f"{epoch_name(epoch)}.pt",
        save_every=run["checkpoints"].get("save_every"),
        device=device,
        log_path=snakemake.output.log_table,
        resume_dir=resume_dir,
        resume_every=snakemake.config.get("resume_every"),
    )
    write_json(
        snakemake.output.metadata,
        {
            "index": index,
            "device": str(device),
            "settings": vars(settings),
            "final_holdout_accuracy": float(table["holdout_accuracy"].iloc[-1]),
            "provenance": provenance(run, {"dataset": data.content_hash}),
        },
    )
    clear_resume_state(resume_dir)


if __name__ == "__main__":
    run_script(main, "train_{run}", globals().get("snakemake"))
