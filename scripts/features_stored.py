"""Rule features_stored: one representation's features file of one snapshot of stored activations
(a run with checkpoints.source: activations), built a layer at a time with no model.

By hand, from the run's working directory:
    python scripts/features_stored.py run=acts index=0 epoch=0003 representation=mean
"""

from _helpers import execution, run_script

from epochlens.data.text_rows import open_any_dataset
from epochlens.features.stored import load_or_build
from epochlens.features.stored_settings import StoredFeatureSettings
from epochlens.runner import log


def main(snakemake) -> None:
    # Batch size does not change the features (nor the cache key): read from the config.
    batch_size = execution(snakemake, "features")["batch_size"]
    settings = StoredFeatureSettings(**snakemake.params.settings, batch_size=batch_size)
    data = open_any_dataset(snakemake.input.dataset)
    result = load_or_build(snakemake.output.features, snakemake.input.snapshot, data, settings, True)
    features = result.features
    log.info(
        "epoch %s: %s (%s) from %s; layers %s, representations %s, %s, in %.1f s",
        snakemake.wildcards.epoch,
        "read from the cache" if result.hit else "built",
        result.reason,
        snakemake.input.snapshot,
        features.layers if len(features.layers) <= 8 else f"{len(features.layers)} layers",
        features.representations,
        features.dtype,
        result.seconds,
    )


if __name__ == "__main__":
    run_script(main, "features_stored", globals().get("snakemake"))
