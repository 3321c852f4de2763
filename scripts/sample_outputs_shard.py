"""Rule sample_outputs_shard: what each analysed checkpoint of one replicate index predicts for
the training and test samples of one shard (loss, probability of the label, margin, correctness;
a regression's absolute error), the dossier's per-checkpoint series that no other stage caches.

By hand, from the run's working directory:
    python scripts/sample_outputs_shard.py run=digits index=0 shard=0 nshards=1
"""

from _helpers import job_resources, run_script

from epochlens.job import load_checkpoint_job
from epochlens.outcome import regression_reduction
from epochlens.runner import log
from epochlens.samples.output_files import stack_outputs, write_outputs
from epochlens.samples.outputs import checkpoint_outputs


def epoch_outputs(snakemake, epoch: int, checkpoint: str) -> dict:
    """The outputs of one checkpoint (logged as it is done)."""
    inp, run = snakemake.input, snakemake.params.run
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
    shard = int(snakemake.wildcards.shard), int(snakemake.wildcards.nshards)
    arrays = checkpoint_outputs(
        job,
        run["evaluation"]["batch_size"],
        regression_reduction(run.get("task")),
        run["data"].get("corruption"),
        shard,
    )
    n = len(arrays["train_loss"]), len(arrays["test_loss"])
    log.info("epoch %d, shard %d of %d: outputs of %d training, %d test samples", epoch, *shard, *n)
    return arrays


def main(snakemake) -> None:
    epochs, checkpoints = snakemake.params.epochs, snakemake.input.checkpoints
    per_epoch = (epoch_outputs(snakemake, e, c) for e, c in zip(epochs, checkpoints, strict=True))
    write_outputs(snakemake.output.shard, stack_outputs(per_epoch, len(epochs)))


if __name__ == "__main__":
    run_script(main, "sample_outputs_shard", globals().get("snakemake"))
