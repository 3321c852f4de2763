"""Rule features_epoch: per-layer features of one checkpoint, cached in features/epoch_{E}.h5."""

from epochlens.checkpoints import load_into
from epochlens.data import read_dataset
from epochlens.device import resolve_device
from epochlens.features.cache import load_or_extract
from epochlens.features.settings import FeatureSettings, RepresentationSettings
from epochlens.models.networks import build_model
from epochlens.provenance import file_sha256
from epochlens.runner import log, run_step

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    p, inp, out = snakemake.params, snakemake.input, snakemake.output
    data = read_dataset(inp.dataset)
    # Batch size and device do not change the features (nor the cache key): read from the config,
    # not params, so that changing them reruns nothing.
    execution = snakemake.config["runs"][snakemake.wildcards.run]["features"]
    settings = FeatureSettings(
        layers=p.settings["layers"],
        representations=RepresentationSettings(**p.settings["representations"]),
        dtype=p.settings["dtype"],
        batch_size=execution["batch_size"],
    )
    device = resolve_device(snakemake.config["device"])

    def model():
        net = build_model(p.model, data.num_classes, data.train_images.shape[1])
        return load_into(net, inp.checkpoint)

    result = load_or_extract(
        out.features, model, data, file_sha256(inp.checkpoint), settings, device, progress=True
    )
    features = result.features
    log.info(
        "epoch %d: %s (%s); layers %s, representations %s, %s, %d train + %d test images on %s in %.1f s",
        int(snakemake.wildcards.epoch),
        "read from the cache" if result.hit else "extracted",
        result.reason,
        features.layers,
        features.representations,
        features.dtype,
        len(data.train_labels),
        len(data.test_labels),
        device,
        result.seconds,
    )


run_step(main, snakemake.log[0])
