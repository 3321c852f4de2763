"""The queries of the study's influence score jobs: which test samples' predictions are attributed
(:mod:`epochlens.study.queries`) and their inputs under each query transform
(:mod:`epochlens.study.transforms`), handed to the engine as a
:class:`~epochlens.influence.study_scores.ScoreQueries`.
"""

from __future__ import annotations

from collections.abc import Mapping

from epochlens.influence.study_scores import ScoreQueries
from epochlens.job import CheckpointJob
from epochlens.outcome import regression_reduction
from epochlens.study.queries import QuerySet, select_lm_queries, select_queries, select_regression_queries
from epochlens.study.transforms import transform_queries


def score_queries(job: CheckpointJob, params: Mapping) -> ScoreQueries:
    """The queries of the job's checkpoint and their transformed inputs.

    Args:
        job: the checkpoint job (its model picks the queries by their predictions).
        params: the score jobs' params (:func:`epochlens.config.influence_score_params`): the
            influence ``settings`` (``queries``, ``transforms`` and their arguments), the
            ``corruption`` (a trigger is stamped on the queries of a backdoor run) and the ``task``.
    """
    spec, q = params["settings"], params["settings"]["queries"]
    selected = _select(job, params)
    transform_args = dict(
        seed=spec["transform_seed"],
        noise_std=spec["noise_std"],
        pad=spec["crop_pad"],
        **{k: spec[k] for k in ("drop_fraction", "keep_fraction") if k in spec},
        pad_token_id=getattr(job.data, "pad_token_id", 0),
    )
    images = {t: transform_queries(selected.images, t, **transform_args) for t in spec["transforms"]}
    return ScoreQueries(selected, images, q["select"], q["labels"], q["max_count"])


def _select(job: CheckpointJob, params: Mapping) -> QuerySet:
    """A regression's test samples under their own targets, a language model's test prompts, or
    a classifier's test images (with the trigger where the run plants one)."""
    q, corruption = params["settings"]["queries"], params["corruption"]
    data, device = job.data, job.device
    if data.is_regression:
        reduction = regression_reduction(params.get("task"))
        return select_regression_queries(
            job.model, data, device, q["select"], q["max_count"], q["seed"], reduction
        )
    if getattr(data, "kind", None) in ("causal_lm", "text_to_text"):
        return select_lm_queries(job.model, data, device, q["select"], q["max_count"], q["seed"])
    trigger = q["trigger"] if q["trigger"] is not None else corruption["kind"] == "trigger"
    return select_queries(
        job.model,
        data,
        job.active,
        device,
        q["select"],
        q["max_count"],
        q["labels"],
        q["seed"],
        trigger=corruption if trigger else None,
    )
