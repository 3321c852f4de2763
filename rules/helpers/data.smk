# Helpers of rules/data.smk: input functions, params and targets.

from epochlens.data import cifar100_files


def get_data_source_files(wildcards):
    """The user's data files (so replacing them rebuilds dataset.h5) and ground-truth positions
    file; none for bundled digits."""
    data = get_run(wildcards)["data"]
    truth = (data.get("ground_truth") or {}).get("indices")
    return data_files(data) + ([truth] if truth else [])


def data_files(data):
    """The files of the data section's source."""
    if data["source"] == "cifar100":
        return [str(p) for p in cifar100_files(data["path"])]
    if data["source"] in ("npz", "parquet", "jsonl", "csv") and os.path.isfile(
        data["path"]
    ):
        return [data["path"]]
    if data["source"] in ("imagefolder", "save_to_disk", "parquet", "jsonl", "csv"):
        # Every file of the folder: replacing, adding or removing an image rebuilds dataset.h5.
        return sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(data["path"])
            for name in names
            if not name.startswith(".")
        )
    return []


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
