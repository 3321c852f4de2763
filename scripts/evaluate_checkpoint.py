"""Rule evaluate_checkpoint: per-class accuracy of one checkpoint on the test set and the holdout.

By hand, from the run's working directory:
    python scripts/evaluate_checkpoint.py run=digits index=0 epoch=0030
"""

from _helpers import job_files, run_script

from epochlens.atomic import write_atomic
from epochlens.evaluation import evaluate_checkpoint
from epochlens.job import load_checkpoint_job
from epochlens.runner import log


def main(snakemake) -> None:
    run, wc = snakemake.params.run, snakemake.wildcards
    job = load_checkpoint_job(model=snakemake.params.model, schedule=run["schedule"], **job_files(snakemake))
    table = evaluate_checkpoint(
        job.model, job.data, job.schedule, job.epoch, run["evaluation"]["batch_size"], job.device
    )
    table.insert(0, "index", int(wc.index))
    table.insert(0, "run", wc.run)
    write_atomic(snakemake.output.table, lambda p: table.to_csv(p, index=False))
    test = table[table["split"] == "test"]
    accuracy = test["n_correct"].sum() / max(test["n"].sum(), 1)
    log.info("epoch %d: %d classes, test accuracy %.3f", job.epoch, test["class_id"].nunique(), accuracy)


if __name__ == "__main__":
    run_script(main, "evaluate_checkpoint", globals().get("snakemake"))
