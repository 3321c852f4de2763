"""Rule sample_dossier: every per-sample result of a run in one table, samples/dossier.parquet
(a row per training sample and index, one per query), from the run's cached results only.

By hand, from the run's working directory: python scripts/sample_dossier.py run=digits_noisy
"""

from pathlib import Path

from _helpers import run_script

from epochlens.runner import log
from epochlens.samples.dossier import DossierInputs, InfluenceScores
from epochlens.samples.dossier_file import write_dossier


def dossier_inputs(snakemake) -> DossierInputs:
    """The rule's files, keyed by what they are (their order is that of the params' job lists)."""
    inp, p = snakemake.input, snakemake.params.dossier
    epochs = [int(e) for e in p["epochs"]]
    curvature = {
        (int(j["index"]), int(j["epoch"])): Path(f).parent
        for j, f in zip(p["curvature"], inp.curvature[::2], strict=True)
    }
    influence = [
        InfluenceScores(int(j["index"]), int(j["epoch"]), j["method"], scores, meta)
        for j, scores, meta in zip(p["influence"], inp.scores, inp.influence_metadata, strict=True)
    ]
    return DossierInputs(
        run=snakemake.wildcards.run,
        task=p["kind"],
        dataset=inp.dataset,
        corrupted=inp.corrupted,
        epochs=epochs,
        outputs=dict(zip([int(i) for i in p["indices"]], inp.outputs, strict=True)),
        curvature=curvature,
        influence=influence,
        reduce=p["reduce"],
    )


def main(snakemake) -> None:
    written = write_dossier(dossier_inputs(snakemake), snakemake.output.dossier)
    log.info(
        "%s: %d training rows, %d query rows, %d columns",
        snakemake.output.dossier,
        written.get("train", 0),
        written.get("query", 0),
        written["columns"],
    )


if __name__ == "__main__":
    run_script(main, "sample_dossier", globals().get("snakemake"))
