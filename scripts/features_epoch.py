"""Rule features_epoch: per-layer features of one checkpoint, cached in features/epoch_{E}.h5.

By hand, from the run's working directory:
    python scripts/features_epoch.py run=digits index=0 epoch=0030
"""

from _helpers import execution, job_files, run_script

from epochlens.features.cache import load_or_extract
from epochlens.features.settings import FeatureSettings, RepresentationSettings
from epochlens.job import load_checkpoint_job
from epochlens.runner import log


def main(snakemake) -> None:
    p = snakemake.params
    job = load_checkpoint_job(model=p.model, **job_files(snakemake))
    # Batch size and device do not change the features (nor the cache key): read from the config,
    # not params, so that changing them reruns nothing.
    settings = FeatureSettings(
        layers=p.settings["layers"],
        representations=RepresentationSettings(**p.settings["representations"]),
        dtype=p.settings["dtype"],
        batch_size=execution(snakemake, "features")["batch_size"],
    )
    # The model is built only on a cache miss.
    result = load_or_extract(
        snakemake.output.features,
        job.build_model,
        job.data,
        job.checkpoint_sha256,
        settings,
        job.device,
        True,
    )
    features, data = result.features, job.data
    log.info(
        "epoch %d: %s (%s); layers %s, representations %s, %s, %d train + %d test images on %s in %.1f s",
        job.epoch,
        "read from the cache" if result.hit else "extracted",
        result.reason,
        features.layers,
        features.representations,
        features.dtype,
        len(data.train_labels),
        len(data.test_labels),
        job.device,
        result.seconds,
    )


if __name__ == "__main__":
    run_script(main, "features_epoch", globals().get("snakemake"))
