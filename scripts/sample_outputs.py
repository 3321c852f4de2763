"""Rule sample_outputs: what each analysed checkpoint of one replicate index predicts for every
training and test sample (loss, probability of the label, margin, correctness; a regression's
absolute error), the dossier's per-checkpoint series that no other stage caches.

By hand, from the run's working directory:
    python scripts/sample_outputs.py run=digits index=0
"""

from _helpers import job_resources, run_script

from epochlens.job import load_checkpoint_job
from epochlens.outcome import regression_reduction
from epochlens.runner import log
from epochlens.samples.outputs import checkpoint_outputs, stack_outputs, write_outputs


def main(snakemake) -> None:
    inp, run = snakemake.input, snakemake.params.run
    per_epoch = []
    for epoch, checkpoint in zip(snakemake.params.epochs, inp.checkpoints, strict=True):
        job = load_checkpoint_job(
            dataset=inp.dataset,
            checkpoint=checkpoint,
            model=snakemake.params.model,
            epoch=epoch,
            device=snakemake.config["device"],
            class_order=inp.class_order,
            schedule=run["schedule"],
            resources=job_resources(snakemake),
        )
        arrays = checkpoint_outputs(
            job,
            run["evaluation"]["batch_size"],
            regression_reduction(run.get("task")),
            trigger=run["data"].get("corruption"),
        )
        per_epoch.append(arrays)
        log.info(
            "epoch %d: outputs of %d training and %d test samples",
            epoch,
            len(arrays["train_loss"]),
            len(arrays["test_loss"]),
        )
    write_outputs(snakemake.output.outputs, stack_outputs(per_epoch))


if __name__ == "__main__":
    run_script(main, "sample_outputs", globals().get("snakemake"))
