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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from epochlens.data.labels import read_labels
from epochlens.errors import DataError
from epochlens.outcome import sample_classes
from epochlens.samples import detectors, neighbours, summaries
from epochlens.samples.arrow_columns import frame_table, row_range, series_arrays
from epochlens.samples.columns import column_spec
from epochlens.samples.identity import identity_frame, stored_strings
from epochlens.samples.thumbnails import has_images

FORMAT_VERSION = 1
#: Training rows whose identity and arrow columns are built at a time (a million rows' Python
#: strings and column copies at once took 1 GB more than the table).
ROWS = 1 << 16
CURVATURE_SERIES = ("curvature", "grad_norm")


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


def load_series(inputs: DossierInputs, index: int, prefix: str) -> dict[str, np.ndarray]:
    """Every series ``{prefix}_{key}`` of one index's ``sample_outputs.npz``, (m checkpoints, N)."""
    path = inputs.outputs[index]
    try:
        with np.load(path, allow_pickle=False) as npz:
            epochs = npz["epochs"].tolist()
            keys = [
                k
                for k in npz.files
                if k.startswith(prefix) and not k.removeprefix(prefix).startswith("trigger_")
            ]
            series = {k.removeprefix(prefix): npz[k] for k in keys}
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(
            f"{path}: not a readable sample_outputs file ({exc}). Rerun its sample_outputs job."
        ) from exc
    if epochs != [int(e) for e in inputs.epochs]:
        raise DataError(
            f"{path}: outputs of checkpoints {epochs}, the run analyses {list(inputs.epochs)}. "
            "Rerun its sample_outputs job."
        )
    return series


def load_curvature(inputs: DossierInputs, index: int, n: int) -> dict[str, np.ndarray]:
    """curvature and grad_norm (m, N), NaN at the checkpoints without curvature; {} without any."""
    folders = [inputs.curvature.get((index, e)) for e in inputs.epochs]
    if not any(folders):
        return {}
    out = {key: np.full((len(folders), n), np.nan, np.float32) for key in CURVATURE_SERIES}
    for row, folder in enumerate(folders):
        if folder is not None:
            for key in CURVATURE_SERIES:
                values = np.load(Path(folder) / f"per_image_{key}.npy", allow_pickle=False)
                if len(values) != n:
                    raise DataError(
                        f"{folder}: per_image_{key}.npy holds {len(values)} samples, the data set {n}: "
                        "the curvature is of other data. Rerun the run's curvature."
                    )
                out[key][row] = values
    return out


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


def train_table(inputs: DossierInputs, index: int, corrupted: np.ndarray | None) -> pa.Table:
    """The training rows of one index: identity, series, summaries, influence, detectors; the
    columns computed over every sample, the rows' identity and arrow columns :data:`ROWS` at a time."""
    stored = read_labels(inputs.dataset, "train")
    n = len(stored.labels)
    series = load_series(inputs, index, "train_")
    if series["loss"].shape[1] != n:
        raise DataError(
            f"{inputs.outputs[index]}: outputs of {series['loss'].shape[1]} samples for "
            f"a data set of {n}: rerun the run's sample_outputs jobs."
        )
    series.update(load_curvature(inputs, index, n))
    cols = summary_columns(series, inputs.epochs, sample_classes(stored.labels))
    influence, transformed = influence_train_columns(inputs, index, n)
    cols.update(influence)
    trained = np.ones(n, bool) if stored.holdout is None else ~stored.holdout
    methods = [job.method for job in last_influence(inputs, index)]
    scores = detectors.detector_scores(cols, methods, series["loss"][-1], transformed)
    cols.update(detectors.detector_columns(scores, trained))
    columns = {**series_arrays(series, inputs.epochs), **cols}
    images = "train" if has_images(inputs.dataset) else None
    parts = []
    for lo in range(0, n, ROWS):  # one chunk (the table of before, byte for byte) up to ROWS rows
        identity = identity_frame(
            inputs.dataset, "train", np.arange(lo, min(n, lo + ROWS)), corrupted, images
        )
        frame = identity.assign(index=np.int32(index), role="train")[["index", "role", *identity.columns]]
        parts.append(frame_table(frame, {k: row_range(v, lo, lo + ROWS) for k, v in columns.items()}))
    return pa.concat_tables(parts)


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
    series = load_series(inputs, index, "test_trigger_" if triggered else "test_")
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


def build_dossier(inputs: DossierInputs) -> pa.Table:
    """The dossier of a run: every index's training rows, then its query rows, with the
    file-level metadata (``b"epochlens"``: JSON of :func:`dossier_metadata`)."""
    if list(inputs.epochs) != sorted(set(inputs.epochs)) or not inputs.epochs:
        raise ValueError(f"epochs must be increasing and not empty, got {list(inputs.epochs)}")
    corrupted = ground_truth(inputs.corrupted)
    tables = []
    for index in inputs.indices:
        tables.append(train_table(inputs, index, corrupted))
        queries = query_table(inputs, index)
        if queries is not None:
            tables.append(queries)
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


def write_dossier(table: pa.Table, path: str | Path) -> None:
    """Write the dossier atomically as zstd-compressed parquet."""
    import pyarrow.parquet as pq

    from epochlens.atomic import write_atomic

    write_atomic(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
