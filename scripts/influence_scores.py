"""Rule influence_scores: self-influence of every training image and its influence on the queries
(one (Q, N) matrix per query transform) at one checkpoint, for one method."""

import time

import numpy as np

from epochlens.atomic import write_atomic, write_json
from epochlens.checkpoints import load_into
from epochlens.data import read_dataset
from epochlens.device import resolve_device
from epochlens.influence.io import factor_cache_key, load_factors, save_table
from epochlens.influence.scores import pairwise_influence, self_influence
from epochlens.models.networks import build_model
from epochlens.provenance import file_sha256, provenance
from epochlens.runner import log, run_step
from epochlens.schedule import schedule_from_config
from epochlens.study.corruption import transform_queries
from epochlens.study.poison import accumulate_tracin, influence_settings, select_queries

snakemake = snakemake  # noqa: F821 - injected by Snakemake


def main() -> None:
    p, w, inp = snakemake.params, snakemake.wildcards, snakemake.input
    cfg = p.config
    spec = cfg["settings"]
    epoch, method = int(w.epoch), w.method
    data = read_dataset(inp.dataset)
    schedule = schedule_from_config(cfg["schedule"], inp.class_order)
    active = schedule.active_classes(epoch)
    device = resolve_device(snakemake.config["device"])

    def model_at(checkpoint):
        model = build_model(cfg["model"], data.num_classes, data.train_images.shape[1])
        return load_into(model, checkpoint)

    # Batch sizes do not change results: read from the config, not params (changing them reruns nothing).
    execution = snakemake.config["runs"][w.run]["influence"]
    settings = influence_settings({**spec, "method": "identity" if method == "tracin" else method}, execution)
    model = model_at(inp.checkpoint)
    n = len(data.train_labels)
    trained = np.flatnonzero(~data.holdout)  # holdout images were not trained on: NaN scores
    x, y = data.normalized("train", trained), data.train_labels[trained]

    queries_cfg = spec["queries"]
    corruption = cfg["corruption"]
    trigger = queries_cfg["trigger"]
    if trigger is None:
        trigger = corruption["kind"] == "trigger"
    queries = select_queries(
        model,
        data,
        active,
        device,
        queries_cfg["select"],
        queries_cfg["max_count"],
        queries_cfg["labels"],
        queries_cfg["seed"],
        trigger=corruption if trigger else None,
    )
    log.info(
        "epoch %d %s: %d training images, %d queries (%d %s test images%s), transforms %s, %s",
        epoch,
        method,
        len(trained),
        len(queries.labels),
        queries.candidates,
        queries_cfg["select"],
        " with the trigger" if queries.triggered else "",
        spec["transforms"],
        device,
    )
    query_images = {
        t: transform_queries(queries.images, t, spec["transform_seed"], spec["noise_std"], spec["crop_pad"])
        for t in spec["transforms"]
    }

    factors = None
    inputs = {
        "dataset": data.content_hash,
        "class_order": file_sha256(inp.class_order),
        "checkpoint": file_sha256(inp.checkpoint),
    }
    if inp.factors:
        key = factor_cache_key(model, x, y, active, settings, trained, checkpoint_sha256=inputs["checkpoint"])
        factors = load_factors(inp.factors[0], expected_key=key)
        inputs["factors"] = file_sha256(inp.factors[0])

    # (epoch, model, active classes) per checkpoint: one for every method but TracIn, which sums
    # the gradient dot products of several.
    if method == "tracin":
        paths = dict(zip(cfg["tracin_epochs"], inp.tracin_checkpoints, strict=True))
        models = [(e, model_at(path), schedule.active_classes(e)) for e, path in paths.items()]
        inputs["tracin_checkpoints"] = {str(e): file_sha256(path) for e, path in paths.items()}
    else:
        models = [(epoch, model, active)]

    timings = {}
    start = time.perf_counter()
    self_parts, pair_parts, losses, diagnostics = [], {t: [] for t in query_images}, None, None
    skipped = set()
    for e, net, act in models:
        suffix = f"_{e}" if method == "tracin" else ""
        t0 = time.perf_counter()
        s = self_influence(net, factors, x, y, act, settings, trained, device, progress=True)
        timings["self" + suffix] = time.perf_counter() - t0
        self_parts.append(s.scores)
        skipped.update(s.skipped.tolist())
        diagnostics = s.diagnostics
        if e == epoch:
            losses = s.losses
        for t, images in query_images.items():
            if len(queries.labels) == 0:
                pair_parts[t].append(np.zeros((0, len(trained))))
                continue
            t0 = time.perf_counter()
            pair = pairwise_influence(
                net,
                factors,
                x,
                y,
                images,
                queries.labels,
                act,
                settings,
                trained,
                queries.test_indices,
                device,
                progress=True,
            )
            timings[f"pairwise_{t}{suffix}"] = time.perf_counter() - t0
            pair_parts[t].append(pair.scores)
    if losses is None:  # TracIn without the influence epoch's own checkpoint
        losses = self_influence(model, None, x, y, active, settings, trained, device).losses
    elapsed = time.perf_counter() - start

    def full(values):  # (..., len(trained)) -> (..., N) with NaN for the holdout
        out = np.full((*values.shape[:-1], n), np.nan, dtype=values.dtype)
        out[..., trained] = values
        return out

    arrays = {
        "self_influence": full(accumulate_tracin(self_parts)),
        "loss": full(np.asarray(losses, np.float64)),
        "query_test_indices": queries.test_indices,
        "query_labels": queries.labels,
        "query_true_labels": queries.true_labels,
        "query_predicted": queries.predicted,
        "query_sign": np.float64(queries.sign),
    }
    for t, parts in pair_parts.items():
        arrays[f"pairwise_{t}"] = full(accumulate_tracin(parts)).astype(np.float32)

    def write_npz(path):
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)

    write_atomic(snakemake.output.scores, write_npz)
    save_table(snakemake.output.diagnostics, diagnostics)
    finite = np.isfinite(arrays["self_influence"])
    write_json(
        snakemake.output.metadata,
        {
            "epoch": epoch,
            "method": method,
            "allowed_classes": [int(c) for c in active],
            "settings": {**{k: v for k, v in vars(settings).items()}, "method": method},
            "tracin_epochs": cfg["tracin_epochs"] or None,
            "queries": {
                "n": len(queries.labels),
                "qualified": queries.candidates,
                "select": queries_cfg["select"],
                "labels": queries_cfg["labels"],
                "triggered": queries.triggered,
                "max_count": queries_cfg["max_count"],
            },
            "transforms": list(spec["transforms"]),
            "corruption": corruption,
            "n_train": int(n),
            "n_scored": int(finite.sum()),
            "skipped": sorted(int(i) for i in skipped),
            "device": str(device),
            "compute_time_seconds": elapsed,
            "timings": timings,
            "stats": {
                "self_influence_median": float(np.nanmedian(arrays["self_influence"]))
                if finite.any()
                else None,
                "max_cond": float(diagnostics["cond"].max()) if len(diagnostics) else None,
                "damping_steps": int(diagnostics["damping_steps"].sum()) if len(diagnostics) else 0,
            },
            "provenance": provenance(cfg, inputs),
        },
    )
    log.info("%d scored of %d training images in %.1f s (%s)", finite.sum(), n, elapsed, timings)


run_step(main, snakemake.log[0])
