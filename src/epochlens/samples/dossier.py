"""The dossier: every per-sample result of a run in one table, ``samples/dossier.parquet``.

One row per training sample and replicate index (role ``train``, every sample of the training
split, holdout included, at its position), one per query of the influence scores (role
``query``); columns :mod:`epochlens.samples.columns`. Built from what the run has cached only: the
checkpoints' outputs (:mod:`epochlens.samples.outputs`), the curvature arrays, the influence
scores, the data set's labels and texts and the ground truth. A column whose stage the run did
not compute is absent; one computed for some indices only (influence of ``influence.indices``)
is null in the others' rows. Influence columns are those of the last influence epoch of each
index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from epochlens.data.labels import read_labels
from epochlens.data.text_rows import stored_strings
from epochlens.errors import DataError
from epochlens.outcome import sample_classes
from epochlens.samples import detectors, neighbours, summaries
from epochlens.samples.arrow_columns import frame_table, row_range, series_arrays
from epochlens.samples.columns import column_spec
from epochlens.samples.identity import identity_frame
from epochlens.samples.series_rows import NpzColumns, load_curvature, series_file, series_keys
from epochlens.samples.thumbnails import has_images

FORMAT_VERSION = 1
#: Training rows whose identity and arrow columns are built at a time (a million rows' Python
#: strings and column copies at once took 1 GB more than the table).
ROWS = 1 << 16


@dataclass
class InfluenceScores:
    """One influence_scores job's files: (index, epoch, method), ``scores.npz``, ``metadata.json``."""

    index: int
    epoch: int
    method: str
    scores: str | Path
    metadata: str | Path | None = None


@dataclass
class DossierInputs:
    """What a dossier is built from.

    Attributes:
        run: the run's name; task: its kind (classification, regression, text_classification,
            text_to_text, causal_lm).
        dataset, corrupted: ``dataset.h5`` and ``corrupted_indices.npy``.
        epochs: the analysed checkpoints, increasing; outputs: ``{index: sample_outputs.npz}``
            for every replicate index.
        curvature: ``{(index, epoch): curvature folder}`` where curvature was computed.
        influence: the influence_scores jobs; reduce: the run's ``queries.reduce``.
    """

    run: str
    task: str
    dataset: str | Path
    corrupted: str | Path
    epochs: Sequence[int]
    outputs: Mapping[int, str | Path]
    curvature: Mapping[tuple[int, int], str | Path] = field(default_factory=dict)
    influence: Sequence[InfluenceScores] = ()
    reduce: str = "max"

    @property
    def indices(self) -> list[int]:
        return sorted(self.outputs)


def ground_truth(path: str | Path) -> np.ndarray | None:
    """The corrupted training positions, or None when none are known (no column then)."""
    positions = np.load(path, allow_pickle=False)
    return positions.astype(np.int64) if len(positions) else None


def summary_columns(series: Mapping[str, np.ndarray], epochs: Sequence[int], labels: np.ndarray) -> dict:
    """The summaries that the run's series allow (:mod:`epochlens.samples.summaries`)."""
    cols: dict[str, np.ndarray] = {}
    if "p_label" in series:
        cols.update(summaries.cartography(series["p_label"], series["correct"]))
    if "abs_error" in series:
        cols.update(summaries.error_map(series["abs_error"]))
    if "margin" in series:
        cols["aum"] = summaries.aum(series["margin"])
    correct = series.get("correct")
    dynamics = summaries.loss_dynamics(
        epochs,
        series["loss"],
        correct if correct is not None else np.zeros(series["loss"].shape, bool),
        labels,
    )
    cols.update(dynamics if correct is not None else {"csl": dynamics["csl"]})
    if "curvature" in series:
        cols.update(summaries.curvature_summary(series["curvature"]))
    return cols


def last_influence(inputs: DossierInputs, index: int) -> list[InfluenceScores]:
    """The influence jobs of ``index`` at its last influence epoch (one per method)."""
    jobs = [job for job in inputs.influence if job.index == index]
    if not jobs:
        return []
    last = max(job.epoch for job in jobs)
    return [job for job in jobs if job.epoch == last]


def influence_train_columns(inputs: DossierInputs, index: int, n: int) -> tuple[dict, dict]:
    """Per method: self-influence, its rank, query influence and neighbours of the training rows,
    and the query influence under each query transform (detectors' scores)."""
    cols: dict = {}
    transformed: dict = {}
    for job in last_influence(inputs, index):
        arrays = neighbours.read_scores(job.scores)
        neighbours.check_scores(job.scores, arrays, n)
        cols.update(neighbours.train_columns(job.method, arrays, inputs.reduce))
        transformed.update(neighbours.transform_signals(job.method, arrays, inputs.reduce))
    return cols, transformed


def detector_columns_of(inputs: DossierInputs, index: int, npz: NpzColumns, n: int, trained) -> dict:
    """The columns over every training sample at once: influence per method and the detectors'
    scores and flags (Tukey's fence is of all trained samples), from the final loss, the AUM
    (read a chunk of samples at a time) and the influence scores."""
    influence, transformed = influence_train_columns(inputs, index, n)
    keys = series_keys(npz, "train_")
    final_loss = npz.row("train_loss", -1)  # the last checkpoint's only
    whole = dict(influence)
    if "train_margin" in keys:
        whole["aum"] = np.concatenate(
            [summaries.aum(npz.columns("train_margin", lo, lo + ROWS)) for lo in range(0, n, ROWS)]
        )
    methods = [job.method for job in last_influence(inputs, index)]
    scores = detectors.detector_scores(whole, methods, final_loss, transformed)
    return {**influence, **detectors.detector_columns(scores, trained)}


def train_pieces(inputs: DossierInputs, index: int, corrupted: np.ndarray | None) -> Iterator[pa.Table]:
    """The training rows of one index, :data:`ROWS` at a time (one table up to ROWS rows): identity,
    series, summaries, influence, detectors. Only the columns over every sample (influence and
    detectors) are held whole."""
    stored = read_labels(inputs.dataset, "train")
    n = len(stored.labels)
    npz = series_file(inputs.outputs[index], inputs.epochs)
    if npz.shape("train_loss")[-1] != n:
        raise DataError(
            f"{inputs.outputs[index]}: outputs of {npz.shape('train_loss')[-1]} samples for "
            f"a data set of {n}: rerun the run's sample_outputs jobs."
        )
    trained = np.ones(n, bool) if stored.holdout is None else ~stored.holdout
    whole = detector_columns_of(inputs, index, npz, n, trained)
    classes = sample_classes(stored.labels)
    images = "train" if has_images(inputs.dataset) else None
    for lo in range(0, n, ROWS):
        hi = min(n, lo + ROWS)
        series = {k.removeprefix("train_"): npz.columns(k, lo, hi) for k in series_keys(npz, "train_")}
        series.update(load_curvature([inputs.curvature.get((index, e)) for e in inputs.epochs], n, lo, hi))
        cols = summary_columns(series, inputs.epochs, classes[lo:hi])
        cols.update({k: row_range(v, lo, hi) for k, v in whole.items()})
        identity = identity_frame(inputs.dataset, "train", np.arange(lo, hi), corrupted, images, stored)
        frame = identity.assign(index=np.int32(index), role="train")[["index", "role", *identity.columns]]
        yield frame_table(frame, {**series_arrays(series, inputs.epochs), **cols})


def query_table(inputs: DossierInputs, index: int) -> pa.Table | None:
    """The query rows of one index (its last influence epoch's queries), None without queries."""
    jobs = last_influence(inputs, index)
    if not jobs:
        return None
    arrays = {job.method: neighbours.read_scores(job.scores) for job in jobs}
    tests = arrays[jobs[0].method]["query_test_indices"].astype(np.int64)
    for job in jobs[1:]:
        if not np.array_equal(arrays[job.method]["query_test_indices"], tests):
            raise DataError(
                f"{job.scores}: other queries than {jobs[0].scores}; rerun the influence_scores jobs."
            )
    if len(tests) == 0:
        return None
    triggered = queries_triggered(jobs[0])
    npz, prefix = series_file(inputs.outputs[index], inputs.epochs), "test_trigger_" if triggered else "test_"
    series = {k.removeprefix(prefix): npz.whole(k) for k in series_keys(npz, prefix)}
    if not series:
        raise DataError(
            f"{inputs.outputs[index]}: no outputs of the triggered test samples that are "
            "the queries; rerun the run's sample_outputs jobs."
        )
    series = {k: v[:, tests] for k, v in series.items()}
    images = ("test_trigger" if triggered else "test") if has_images(inputs.dataset) else None
    frame = identity_frame(inputs.dataset, "test", tests, None, images)
    if triggered and "text" in frame:
        frame["text"] = trigger_texts(inputs.dataset)[tests]
    frame["position"] = np.arange(len(tests), dtype=np.int64)
    frame = frame.assign(index=np.int32(index), role="query")
    frame = frame[["index", "role", *[c for c in frame.columns if c not in ("index", "role")]]]
    cols = {}
    for job in jobs:
        cols.update(neighbours.query_columns(job.method, arrays[job.method]))
    return frame_table(frame, {**series_arrays(series, inputs.epochs), **cols})


def queries_triggered(job: InfluenceScores) -> bool:
    """Whether the job's queries carry the backdoor's trigger (its ``metadata.json``)."""
    if job.metadata is None or not Path(job.metadata).exists():
        return False
    return bool(json.loads(Path(job.metadata).read_text()).get("queries", {}).get("triggered", False))


def trigger_texts(dataset: str | Path) -> np.ndarray:
    """The test sentences with the trigger phrase (``test_trigger/text``)."""
    return np.asarray(stored_strings(dataset, "test_trigger/text"), dtype=object)


def dossier_pieces(inputs: DossierInputs) -> Iterator[list[pa.Table]]:
    """The dossier in groups of tables of one schema each: every index's training rows (a table
    per :data:`ROWS` rows), then its query rows."""
    if list(inputs.epochs) != sorted(set(inputs.epochs)) or not inputs.epochs:
        raise ValueError(f"epochs must be increasing and not empty, got {list(inputs.epochs)}")
    corrupted = ground_truth(inputs.corrupted)
    for index in inputs.indices:
        yield train_pieces(inputs, index, corrupted)
        queries = query_table(inputs, index)
        if queries is not None:
            yield iter([queries])


def build_dossier(inputs: DossierInputs) -> pa.Table:
    """The dossier of a run as one table, in memory (``dossier_file.write_dossier`` writes one by
    row groups), with the file-level metadata (``b"epochlens"``: JSON of :func:`dossier_metadata`)."""
    tables = [table for group in dossier_pieces(inputs) for table in group]
    table = pa.concat_tables(tables, promote_options="default")
    metadata = dossier_metadata(inputs, table.column_names)
    return table.replace_schema_metadata({b"epochlens": json.dumps(metadata).encode()})


def dossier_metadata(inputs: DossierInputs, columns: Sequence[str]) -> dict:
    """What the file says of itself: version, run, task, epochs, methods, detectors, columns."""
    last: dict[str, int] = {}
    for job in inputs.influence:
        last[str(job.index)] = max(int(job.epoch), last.get(str(job.index), int(job.epoch)))
    return {
        "version": FORMAT_VERSION,
        "run": inputs.run,
        "task": inputs.task,
        "epochs": [int(e) for e in inputs.epochs],
        "influence_epochs": last,
        "influence_methods": sorted({job.method for job in inputs.influence}),
        "detectors": [c.removeprefix("is_") for c in columns if c.startswith("is_") and c != "is_corrupted"],
        "columns": {name: column_spec(name)[1] for name in columns},
    }
