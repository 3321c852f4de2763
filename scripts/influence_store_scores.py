"""Rule influence_store_scores: self-influence of every training image and its influence on the
queries (one (Q, N) matrix per query transform) at one checkpoint for a projected method (logra),
from its gradient store and its curvature: the queries' projected gradients and one read of the store;
for tracin_rp the sum over the stores of its checkpoints (tracin_epochs), without curvature.

By hand, from the run's working directory:
    python scripts/influence_store_scores.py run=digits_noisy index=0 epoch=0075 method=logra
"""

import numpy as np
from _helpers import execution, job_files, run_script

from epochlens.atomic import write_atomic, write_json
from epochlens.influence.study_store_scores import store_checkpoint_scores
from epochlens.influence.study_store_tracin import store_tracin_scores
from epochlens.job import load_checkpoint_job
from epochlens.study.score_queries import score_queries


def main(snakemake) -> None:
    cfg, inp, wc = snakemake.params.config, snakemake.input, snakemake.wildcards
    job = load_checkpoint_job(model=cfg["model"], schedule=cfg["schedule"], **job_files(snakemake))
    store, exe = list(zip(inp.gradients, inp.infos, strict=True)), execution(snakemake, "influence")
    if wc.method == "tracin_rp":  # the shards of each checkpoint's store, checkpoint by checkpoint
        epochs, per = cfg["tracin_epochs"], len(store) // len(cfg["tracin_epochs"])
        stores = {e: store[k * per : (k + 1) * per] for k, e in enumerate(epochs)}
        checkpoints = dict(zip(epochs, inp.tracin_checkpoints, strict=True))
        result = store_tracin_scores(job, cfg, exe, stores, checkpoints, queries=score_queries(job, cfg))
    else:
        result = store_checkpoint_scores(
            job, wc.method, cfg, exe, store, inp.curvature, progress=True, queries=score_queries(job, cfg)
        )

    def write_npz(path):
        with open(path, "wb") as f:
            np.savez_compressed(f, **result.arrays)

    write_atomic(snakemake.output.scores, write_npz)
    write_atomic(snakemake.output.diagnostics, lambda path: result.diagnostics.to_csv(path, index=False))
    write_json(snakemake.output.metadata, result.metadata)


if __name__ == "__main__":
    run_script(main, "influence_store_scores", globals().get("snakemake"))
