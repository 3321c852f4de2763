"""Rule evaluate_checkpoint: per-class accuracy of one checkpoint on the test set and the holdout
(a regression: MSE, MAE and R² per split and data group).

By hand, from the run's working directory:
    python scripts/evaluate_checkpoint.py run=digits index=0 epoch=0030
"""

from _helpers import job_files, run_script

from epochlens.atomic import write_atomic
from epochlens.evaluation import evaluate_checkpoint, evaluate_regression
from epochlens.job import load_checkpoint_job
from epochlens.outcome import regression_reduction
from epochlens.runner import log


def main(snakemake) -> None:
    run, wc = snakemake.params.run, snakemake.wildcards
    job = load_checkpoint_job(model=snakemake.params.model, schedule=run["schedule"], **job_files(snakemake))
    batch_size = run["evaluation"]["batch_size"]
    if job.data.is_regression:
        reduction = regression_reduction(run["task"])
        table = evaluate_regression(job.model, job.data, job.epoch, reduction, batch_size, job.device)
    else:
        table = evaluate_checkpoint(job.model, job.data, job.schedule, job.epoch, batch_size, job.device)
    table.insert(0, "index", int(wc.index))
    table.insert(0, "run", wc.run)
    write_atomic(snakemake.output.table, lambda p: table.to_csv(p, index=False))
    test = table[table["split"] == "test"]
    if job.data.is_regression:
        whole = test[test["data_group"] == "all"].iloc[0]
        log.info(
            "epoch %d: test MSE %.6g, MAE %.6g, R² %.4f", job.epoch, whole["mse"], whole["mae"], whole["r2"]
        )
        return
    accuracy = test["n_correct"].sum() / max(test["n"].sum(), 1)
    log.info("epoch %d: %d classes, test accuracy %.3f", job.epoch, test["class_id"].nunique(), accuracy)


if __name__ == "__main__":
    run_script(main, "evaluate_checkpoint", globals().get("snakemake"))
