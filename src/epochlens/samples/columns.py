"""The dossier's columns: each one's arrow type and one-line description, by name or by the
pattern of a per-method or per-detector name (``docs/guides/dossier.md`` is the users' version;
``/work/notes/dossier_contract.md`` the contract with the explorer)."""

from __future__ import annotations

import re

import pyarrow as pa

F32, F64, I64 = pa.float32(), pa.float64(), pa.int64()

#: name: (type, description) of the columns with fixed names.
FIXED: dict[str, tuple[pa.DataType, str]] = {
    "index": (pa.int32(), "replicate index (seed) of the run"),
    "role": (pa.string(), "train: a training sample; query: a query of the influence scores"),
    "position": (
        I64,
        "position in the run's arrays of its role (training arrays; the queries of scores.npz)",
    ),
    "id": (pa.string(), "{train|test}:{position in that split of dataset.h5}"),
    "split": (pa.string(), "train, holdout (in the training split, not trained on) or test"),
    "label": (I64, "class id trained on (a flipped label where data.corruption flipped it)"),
    "label_name": (pa.string(), "name of the label's class"),
    "target": (F64, "regression target"),
    "group": (pa.string(), "the sample's data group (task or cohort column of the data)"),
    "text": (pa.string(), "the text (a triggered query: with the trigger phrase)"),
    "image": (pa.string(), "the sample's thumbnail: its sheet's path and box (sheet.png#xywh=x,y,w,h)"),
    "is_corrupted": (
        pa.bool_(),
        "ground truth: corrupted on purpose or marked by the user (null for queries)",
    ),
    "epochs": (pa.list_(pa.int32()), "the checkpoints of every series column, in order"),
    "loss": (pa.list_(F32), "per-sample loss at each checkpoint (NaN: class not active yet)"),
    "p_label": (pa.list_(F32), "softmax probability of the label over the active classes"),
    "abs_error": (pa.list_(F32), "regression: mean absolute error of the sample's prediction"),
    "margin": (pa.list_(F32), "logit of the label minus the largest other logit (AUM's margin)"),
    "correct": (pa.list_(pa.bool_()), "predicted right (a sequence model: exact match)"),
    "predicted": (pa.list_(I64), "predicted class id (-1: class not active yet)"),
    "curvature": (pa.list_(F32), "input-loss curvature (NaN: not computed at that checkpoint)"),
    "grad_norm": (pa.list_(F32), "input-gradient norm (NaN: not computed at that checkpoint)"),
    "confidence": (F64, "Cartography: mean p_label over the checkpoints where the sample is active"),
    "variability": (F64, "Cartography: std (ddof 0) of p_label over those checkpoints"),
    "correctness": (F64, "Cartography: fraction of those checkpoints at which it is predicted right"),
    "error_mean": (F64, "regression data map: mean absolute error over the checkpoints"),
    "error_variability": (F64, "regression data map: std (ddof 0) of the absolute error"),
    "aum": (F64, "area under the margin: mean margin over the active checkpoints"),
    "learning_time": (F64, "first checkpoint from which it is predicted right at every later one"),
    "forgetting_events": (pa.int32(), "right -> wrong transitions between consecutive checkpoints"),
    "csl": (F64, "cumulative sample loss: sum of the loss over the active checkpoints"),
    "curvature_mean": (F64, "mean curvature over the checkpoints where it was computed"),
    "curvature_max": (F64, "largest curvature over those checkpoints"),
}

#: (pattern, type, description) of the per-method and per-detector columns.
PATTERNS: list[tuple[str, pa.DataType, str]] = [
    (r"self_influence_rank_(\w+)", I64, "rank of the self-influence of {0} (1: highest)"),
    (r"self_influence_(\w+)", F64, "self-influence of {0} (NaN: holdout, not trained on)"),
    (r"query_influence_(\w+)", F64, "influence of {0} on the queries, reduced (higher: more suspect)"),
    (r"(proponents|opponents)_(\w+)", pa.list_(I64), "query positions: top {0} of {1} (most first)"),
    (r"(proponent|opponent)_scores_(\w+)", pa.list_(F64), "{1}'s pairwise scores of those {0}s"),
    (r"(top|bottom)_train_scores_(\w+)", pa.list_(F64), "{1}'s scores of those training samples"),
    (r"(top|bottom)_train_(\w+)", pa.list_(I64), "training positions with the {0} pairwise scores of {1}"),
    (r"is_(\w+)", pa.bool_(), "flagged by detector {0} (score above Tukey's upper fence)"),
    (r"(\w+)_score", F64, "score of detector {0} (higher: more suspect)"),
]


def column_spec(name: str) -> tuple[pa.DataType, str]:
    """The arrow type and description of column ``name``.

    Raises:
        KeyError: a name the dossier does not define (a bug: every column is declared here)."""
    if name in FIXED:
        return FIXED[name]
    for pattern, kind, text in PATTERNS:
        match = re.fullmatch(pattern, name)
        if match:
            return kind, text.format(*match.groups())
    raise KeyError(f"dossier column {name!r} is not declared in epochlens.samples.columns")
