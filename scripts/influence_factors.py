"""Rule influence_factors: the curvature factors of one checkpoint (ekfac, kfac or diagonal), fitted
on the training images it was trained on, and their per-layer spectrum (before damping)."""

import dataclasses

import numpy as np
import pandas as pd

from epochlens.checkpoints import load_into
from epochlens.data import read_dataset
from epochlens.device import resolve_device
from epochlens.influence.factors import fit_factors
from epochlens.influence.io import factor_cache_key, save_factors, save_table
from epochlens.models.networks import build_model
from epochlens.provenance import file_sha256
from epochlens.runner import log, run_step
from epochlens.schedule import schedule_from_config
from epochlens.study.poison import influence_settings

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def spectrum(factors) -> pd.DataFrame:
    """Per layer: the undamped curvature's eigenvalue range and the factor solves (no damping)."""
    rows = []
    for name, lf in factors.layers.items():
        eig = lf.eigenvalues(factors.method).clamp_min(0.0)
        positive = eig[eig > 0]
        rows.append(
            {
                "layer": name,
                "kind": lf.kind,
                "out_dim": lf.out_dim,
                "in_dim": lf.in_dim,
                "n_samples": lf.n_samples,
                "min_eig": float(eig.min()),
                "max_eig": float(eig.max()),
                "mean_eig": float(eig.mean()),
                "zero_eig_share": float((eig == 0).double().mean()),
                "cond_positive": float(positive.max() / positive.min()) if len(positive) else np.nan,
                "activation_min_raw": lf.min_raw.get("A", np.nan),
                "gradient_min_raw": lf.min_raw.get("S", np.nan),
                "solver": "; ".join(f"{k}: {v}" for k, v in lf.solver.items()),
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    p, w = snakemake.params, snakemake.wildcards
    epoch = int(w.epoch)
    data = read_dataset(snakemake.input.dataset)
    active = schedule_from_config(p.config["schedule"], snakemake.input.class_order).active_classes(epoch)
    model = build_model(p.config["model"], data.num_classes, data.train_images.shape[1])
    load_into(model, snakemake.input.checkpoint)
    # Batch sizes do not change results: read from the config, not params (changing them reruns nothing).
    execution = snakemake.config["runs"][w.run]["influence"]
    settings = influence_settings(p.config["settings"], execution)
    device = resolve_device(snakemake.config["device"])
    trained = np.flatnonzero(~data.holdout)  # the images the checkpoint was trained on (active ones)
    x, y = data.normalized("train", trained), data.train_labels[trained]
    key = factor_cache_key(
        model, x, y, active, settings, trained, checkpoint_sha256=file_sha256(snakemake.input.checkpoint)
    )
    log.info(
        "epoch %d %s: fitting on %d images, %d active classes, %s",
        epoch,
        w.method,
        len(trained),
        len(active),
        device,
    )
    factors = fit_factors(model, x, y, active, settings, trained, device=device, key=key, progress=True)
    # Timings go to the log, not the file: the same inputs give the same bytes.
    save_factors(snakemake.output.factors, dataclasses.replace(factors, timings={}))
    table = spectrum(factors)
    save_table(snakemake.output.diagnostics, table)
    log.info(
        "%d layers, %d samples (%d skipped), timings %s; largest undamped condition number %.3g",
        len(table),
        factors.n_samples,
        len(factors.skipped),
        {k: round(v, 2) for k, v in factors.timings.items()},
        table["cond_positive"].max(),
    )


run_step(main, snakemake.log[0])
