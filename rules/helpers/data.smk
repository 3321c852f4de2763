# Helpers of rules/data.smk: input functions, params and targets.

from epochlens.data import cifar100_files
from epochlens.formats.folder_listing import FOLDER_SOURCES, folder_fingerprint
from epochlens.memory_sources import data_folder_bytes


def get_data_source_files(wildcards):
    """The user's data files (so replacing them rebuilds dataset.h5) and ground-truth positions
    file; none for bundled digits, nor for a folder (its fingerprint is a param instead).
    """
    data = get_run(wildcards)["data"]
    truth = (data.get("ground_truth") or {}).get("indices")
    return data_files(data) + ([truth] if truth else [])


def data_files(data):
    """The files of the data section's source, when it is files, not a folder."""
    if data["source"] == "cifar100":
        return [str(p) for p in cifar100_files(data["path"])]
    if data["source"] in ("npz", "parquet", "jsonl", "csv") and os.path.isfile(
        data["path"]
    ):
        return [data["path"]]
    return []


def get_data_params(wildcards):
    """The run's data section; a data folder's with ``folder_files``, the hash of its files' paths,
    sizes and times (epochlens.formats.folder_listing; prepare_data's readers ignore it): replacing,
    adding or removing a file changes the params and so reruns prepare_data, without a plan that
    lists every file as an input. Other sources' params are the data section as it was.
    """
    data = get_run(wildcards)["data"]
    if data["source"] in FOLDER_SOURCES and not os.path.isfile(data["path"]):
        return {**data, "folder_files": folder_fingerprint(data["path"])}
    return data


def get_prepare_data_mem_mb(wildcards, input, attempt):
    """get_mem_mb's memory, with what prepare_data holds of a data folder (not an input: its
    images decoded, or its files; a text run's tables are read a chunk at a time and count once:
    epochlens.memory_sources)."""
    held = data_folder_bytes(get_run(wildcards)["data"])
    return job_mem_mb("prepare_data", input, attempt, folder_bytes=held)


def get_user_class_order(wildcards):
    spec = get_run(wildcards)["class_order"]
    if spec["source"] != "file":
        return []
    path = Path(spec["path"].format(index=int(wildcards.index)))
    if not path.is_file():
        raise WorkflowError(
            f"{path}: class order file not found (run {wildcards.run}, index {wildcards.index}). "
            "Fix class_order.path in the config or use class_order.source: seed."
        )
    return [str(path)]
