"""Rule features_epoch: per-layer features of one checkpoint, cached in features/epoch_{E}.h5
(a text run: each block's hidden states reduced over its tokens, epochlens.features.text).

By hand, from the run's working directory:
    python scripts/features_epoch.py run=digits index=0 epoch=0030
"""

from _helpers import execution, job_files, run_script

from epochlens.data.text import TextDataset
from epochlens.features.cache import load_or_extract
from epochlens.features.settings import FeatureSettings, RepresentationSettings
from epochlens.features.text import load_or_extract_text
from epochlens.features.text_settings import TextFeatureSettings
from epochlens.job import load_checkpoint_job
from epochlens.runner import log


def main(snakemake) -> None:
    p = snakemake.params
    job = load_checkpoint_job(model=p.model, **job_files(snakemake))
    # Batch size and device do not change the features (nor the cache key): read from the config,
    # not params, so that changing them reruns nothing.
    batch_size = execution(snakemake, "features")["batch_size"]
    text = isinstance(job.data, TextDataset)
    if text:
        names = p.settings["representations"]["names"]
        settings = TextFeatureSettings(
            p.settings["layers"], names, p.settings["dtype"], batch_size=batch_size
        )
    else:
        settings = FeatureSettings(
            layers=p.settings["layers"],
            representations=RepresentationSettings(**p.settings["representations"]),
            dtype=p.settings["dtype"],
            precision=p.settings.get("precision", "float32"),
            batch_size=batch_size,
        )
    # The model is built only on a cache miss.
    result = (load_or_extract_text if text else load_or_extract)(
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
        "epoch %d: %s (%s); layers %s, representations %s, %s, %d train + %d test %s on %s in %.1f s",
        job.epoch,
        "read from the cache" if result.hit else "extracted",
        result.reason,
        features.layers,
        features.representations,
        features.dtype,
        len(data.train_labels),
        len(data.test_labels),
        "sequences" if text else "images",
        job.device,
        result.seconds,
    )


if __name__ == "__main__":
    run_script(main, "features_epoch", globals().get("snakemake"))
