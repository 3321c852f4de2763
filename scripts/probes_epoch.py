"""Rule probes_epoch: linear probes on one checkpoint's cached features, one row per seed.

A classifier's targets come from its class schedule; a regression's (no classes) from its float
targets in dataset.h5 (the ridge probe and their quantile bins), a language model's or a text-to-text
model's from its data groups in dataset.h5, never from the features file.

By hand, from the run's working directory:
    python scripts/probes_epoch.py run=digits index=0 epoch=0030
"""

import numpy as np
from _helpers import job_resources, run_script

from epochlens.atomic import write_atomic
from epochlens.data.text_rows import open_any_dataset
from epochlens.device import job_device
from epochlens.errors import DataError
from epochlens.features.cache import FeatureSet
from epochlens.probes.linear import probe_checkpoint
from epochlens.probes.settings import ProbeSettings
from epochlens.probes.targets import select_lm_targets, select_regression_targets, select_targets
from epochlens.runner import log
from epochlens.schedule import schedule_from_config


def main(snakemake) -> None:
    p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
    epoch = int(wc.epoch)
    features = FeatureSet(inp.features)
    data = open_any_dataset(inp.dataset)  # images, or a text run's token ids
    if features.attrs.get("data_content_hash") != data.content_hash:
        raise DataError(
            f"{inp.features} holds features of another data set than {inp.dataset}; delete it and rerun."
        )
    curvature = np.load(inp.curvature[0]) if inp.curvature else None
    if getattr(data, "is_regression", False):
        targets, skipped = select_regression_targets(
            {split: data.labels(split) for split in ("train", "test")},
            p.probes["targets"],
            curvature,
            p.probes["curvature_bins"],
            p.probes["target_bins"],
            fit=~data.holdout,
        )
    elif getattr(data, "token_labels", False):  # a causal LM, text-to-text: data groups, curvature
        groups = None if data.train_groups is None else {s: data.groups(s) for s in ("train", "test")}
        targets, skipped = select_lm_targets(
            groups, p.probes["targets"], curvature, p.probes["curvature_bins"], fit=~data.holdout
        )
    else:
        schedule = schedule_from_config(p.schedule, inp.class_order)
        targets, skipped = select_targets(
            {split: features.labels(split) for split in ("train", "test")},
            schedule.active_classes(epoch),
            schedule.new_classes(epoch),
            p.probes["targets"],
            curvature,
            p.probes["curvature_bins"],
            fit=~data.holdout,
        )
    for name, why in skipped.items():
        log.info("target %s %s", name, why)
    context = {"run": wc.run, "index": int(wc.index), "epoch": epoch}
    settings = ProbeSettings(**p.probes["settings"])
    device = job_device(snakemake.config["device"], job_resources(snakemake))
    table = probe_checkpoint(
        features, targets, skipped, data.holdout, settings, context, device, progress=True
    )
    write_atomic(snakemake.output.table, lambda path: table.to_csv(path, index=False))


if __name__ == "__main__":
    run_script(main, "probes_epoch", globals().get("snakemake"))
