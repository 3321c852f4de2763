"""The ``comparisons`` section: runs compared across their replicate indices (torch-free).

Checked while the workflow is planned (each error names the key and the fix) and resolved into what
the comparison job reads (:func:`comparison_plan`): per comparison, each run's kind, checkpoint
epoch and indices, and the metrics. Which run-level table each metric comes from:
:func:`comparison_sources`; the statistics are :mod:`epochlens.compare`'s.
"""

from __future__ import annotations

from epochlens.config import epochs
from epochlens.config.run_kinds import is_regression_run, task_name
from epochlens.errors import ConfigError

#: The folder under ``results/`` of the tables and figures that compare runs (not a run's folder:
#: no run may be named so while comparisons are configured).
COMPARISONS_DIR = "comparisons"

#: The metrics of each kind of run, the first ones its default. classification: test (or holdout)
#: accuracy and mean cross-entropy from tables/accuracy_per_class.csv; regression: from
#: tables/regression_metrics.csv; mean_curvature (either kind): the mean per-image curvature of the
#: training images at the checkpoint, from tables/curvature_per_cohort.csv.
METRICS = {
    "classification": ("accuracy", "loss", "mean_curvature"),
    "regression": ("mse", "mae", "r2", "loss", "mean_curvature"),
}
DEFAULT_METRICS = {"classification": ["accuracy", "loss"], "regression": ["mse", "mae", "r2"]}

#: The run-level table each (kind, metric) is read from (:func:`comparison_sources`).
SOURCES = {"classification": "accuracy", "regression": "regression"}


def run_kind(run: dict) -> str:
    """``regression`` or ``classification`` (every other task: its metrics are read from the
    accuracy tables, as a causal LM's exact match and loss are)."""
    return "regression" if is_regression_run(run) else "classification"


def metric_source(kind: str, metric: str) -> str:
    """The table a metric of a run of ``kind`` comes from: ``accuracy``, ``regression`` or
    ``curvature``."""
    return "curvature" if metric == "mean_curvature" else SOURCES[kind]


def _where(k: int, comparison: dict) -> str:
    return f"comparisons[{k}] ({comparison['name']})"


def check_comparisons(config: dict) -> None:
    """Every comparison's runs, metrics, checkpoint and split (defaults filled in); raises
    :class:`~epochlens.errors.ConfigError` naming the key and the fix."""
    comparisons = config.get("comparisons") or []
    runs = config["runs"]
    if comparisons and COMPARISONS_DIR in runs:
        raise ConfigError(
            f"runs.{COMPARISONS_DIR}: results/{COMPARISONS_DIR}/ holds the tables and figures of the "
            "comparisons section; rename this run."
        )
    names = [c["name"] for c in comparisons]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"comparisons: names {repeated} are used twice; give each comparison its own name.")
    for k, comparison in enumerate(comparisons):
        _check_comparison(k, comparison, runs)


def _check_comparison(k: int, comparison: dict, runs: dict) -> None:
    where = _where(k, comparison)
    unknown = [r for r in comparison["runs"] if r not in runs]
    if unknown:
        raise ConfigError(f"{where}.runs: {unknown} are not runs of this config; pick from {sorted(runs)}.")
    kinds = {r: run_kind(runs[r]) for r in comparison["runs"]}
    if len(set(kinds.values())) > 1:
        raise ConfigError(
            f"{where}.runs: {kinds} mixes classification and regression runs, whose metrics differ; "
            "compare runs of one kind."
        )
    kind = next(iter(kinds.values()))
    for run in comparison["runs"]:
        indices = runs[run]["indices"]
        if len(indices) < 2:
            raise ConfigError(
                f"{where}.runs: run {run} has {len(indices)} replicate index ({indices}); a "
                f"confidence interval over indices needs 2 or more: add indices to runs.{run}.indices "
                "(one training run each), or leave the run out of the comparison."
            )
    _check_same_data(where, comparison["runs"], runs)
    for metric in comparison["metrics"] or DEFAULT_METRICS[kind]:
        if metric not in METRICS[kind]:
            other = "regression" if kind == "classification" else "classification"
            raise ConfigError(
                f"{where}.metrics: {metric} is a metric of {other} runs, and {comparison['runs'][0]} "
                f"is a {kind} run (task: {task_name(runs[comparison['runs'][0]])}); its metrics are "
                f"{list(METRICS[kind])}."
            )
    if comparison["split"] == "holdout" and kind == "classification":
        without = [r for r in comparison["runs"] if not runs[r]["data"].get("holdout_per_class")]
        if without:
            raise ConfigError(
                f"{where}.split: holdout, but runs {without} have no holdout (data.holdout_per_class: "
                "0); set data.holdout_per_class in each run, or split: test."
            )
    for run in comparison["runs"]:
        comparison_epoch(where, run, runs[run], comparison)


def _check_same_data(where: str, names: list[str], runs: dict) -> None:
    """The runs' ``data`` sections are equal but for ``corruption`` (which changes the training
    split only): the same test and holdout images. The job compares their content as well."""
    base = names[0]
    reference = _test_data(runs[base])
    for run in names[1:]:
        data = _test_data(runs[run])
        if data != reference:
            keys = sorted(k for k in set(data) | set(reference) if data.get(k) != reference.get(k))
            differs = "; ".join(f"data.{k}: {reference.get(k)!r} vs {data.get(k)!r}" for k in keys)
            raise ConfigError(
                f"{where}.runs: {base} and {run} do not have the same test data ({differs}); runs are "
                "compared on the same data sections, where only data.corruption may differ (it "
                "touches the training split only). Compare runs on the same data."
            )


def _test_data(run: dict) -> dict:
    return {k: v for k, v in run["data"].items() if k != "corruption"}


def comparison_epoch(where: str, name: str, run: dict, comparison: dict) -> int:
    """The checkpoint epoch at which run ``name`` is compared: its last analysed epoch
    (``epoch: last``) or the given one, which must be an analysed epoch (and one whose curvature is
    computed, for mean_curvature)."""
    analysed = epochs.analysis_epochs(name, run)
    spec = comparison["epoch"]
    epoch = analysed[-1] if spec == "last" else int(spec)
    if epoch not in analysed:
        raise ConfigError(
            f"{where}.epoch: {epoch} is not an analysed epoch of run {name} ({analysed}); pick one "
            "that every run has, or epoch: last (each run's last checkpoint)."
        )
    metrics = comparison["metrics"] or DEFAULT_METRICS[run_kind(run)]
    if "mean_curvature" in metrics and epoch not in epochs.curvature_epochs(name, run):
        raise ConfigError(
            f"{where}.metrics: mean_curvature at epoch {epoch}, but run {name} computes no "
            f"curvature there (runs.{name}.curvature: enabled {run['curvature']['enabled']}, epochs "
            f"{epochs.curvature_epochs(name, run)}); enable it at that epoch, or leave mean_curvature out."
        )
    return epoch


def comparison_plan(config: dict) -> list[dict]:
    """Every comparison as the comparison job reads it: ``name``, ``metrics``, ``split``,
    ``differences`` and ``runs``, a list of ``{run, kind, epoch, indices, sources}`` (the baseline
    first; ``sources``: the table of each metric, :func:`metric_source`). A validated config
    (:func:`check_comparisons`)."""
    plan = []
    for k, comparison in enumerate(config.get("comparisons") or []):
        runs = comparison["runs"]
        kind = run_kind(config["runs"][runs[0]])
        metrics = list(comparison["metrics"] or DEFAULT_METRICS[kind])
        plan.append(
            {
                "name": comparison["name"],
                "metrics": metrics,
                "split": comparison["split"],
                "differences": comparison["differences"],
                "runs": [
                    {
                        "run": run,
                        "kind": kind,
                        "epoch": comparison_epoch(
                            _where(k, comparison), run, config["runs"][run], comparison
                        ),
                        "indices": list(config["runs"][run]["indices"]),
                        "sources": {m: metric_source(kind, m) for m in metrics},
                    }
                    for run in runs
                ],
            }
        )
    return plan


def comparison_sources(config: dict) -> dict[str, list[str]]:
    """The runs whose tables the comparisons read, per table: ``accuracy``
    (tables/accuracy_per_class.csv), ``regression`` (tables/regression_metrics.csv), ``curvature``
    (tables/curvature_per_cohort.csv) and ``dataset`` (data/dataset.h5: its test split's content is
    compared); each list in order of first use."""
    sources: dict[str, list[str]] = {"accuracy": [], "regression": [], "curvature": [], "dataset": []}
    for comparison in comparison_plan(config):
        for entry in comparison["runs"]:
            for source in entry["sources"].values():
                sources[source].append(entry["run"])
            sources["dataset"].append(entry["run"])
    return {key: list(dict.fromkeys(runs)) for key, runs in sources.items()}
