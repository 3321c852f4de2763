"""Rule lds_retrain: part k of P of the retrainings on random subsets of the training samples
(images or sentences) that the linear datamodeling score of one checkpoint is measured on
(epochlens.study.lds): with the pipeline's own recipe, or by the run's training command
(checkpoints.source: command with {subset}; epochlens.study.retrain_command).

By hand, from the run's working directory:
    python scripts/lds_retrain.py run=digits_noisy index=0 epoch=0075 part=0 nparts=1
"""

import json
from pathlib import Path

import numpy as np
from _helpers import job_resources, run_script

from epochlens.atomic import write_atomic
from epochlens.checkpoints import load_state_dict
from epochlens.data.text_rows import read_any_dataset
from epochlens.device import job_device
from epochlens.models.build import build_untrained
from epochlens.provenance import file_sha256, provenance
from epochlens.schedule import schedule_from_config
from epochlens.study.retrain import retrain_part
from epochlens.study.retrain_command import CommandPart, command_part, remove_subset_folders
from epochlens.training import TrainSettings


def write_part(path: str, arrays: dict, info: dict) -> None:
    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays, info=np.array(json.dumps(info)))

    write_atomic(path, write)


def main(snakemake) -> None:
    if snakemake.config["runs"][snakemake.wildcards.run]["checkpoints"]["source"] == "command":
        return retrain_by_command(snakemake)
    run, lds, wc = snakemake.params.run, snakemake.params.lds, snakemake.wildcards
    index, epoch = int(wc.index), int(wc.epoch)
    data = read_any_dataset(snakemake.input.dataset)
    schedule = schedule_from_config(run["schedule"], snakemake.input.class_order)
    # The run's own recipe, as its training job (scripts/train.py) applies it.
    settings = TrainSettings(**{**run["train"], "seed": run["train"]["seed"] + index})
    device = job_device(snakemake.config["device"], job_resources(snakemake))
    output = Path(snakemake.output.part)
    start, inputs = None, {"dataset": data.content_hash}
    if snakemake.input.start:  # influence.lds.start: previous, the run's checkpoint before epoch
        start = (snakemake.params.start_epoch, load_state_dict(snakemake.input.start[0]))
        inputs["start_checkpoint"] = file_sha256(snakemake.input.start[0])
    arrays = retrain_part(
        lambda: build_untrained(run["model"], data, settings.seed),
        data, schedule, settings, epoch, lds, int(wc.part), int(wc.nparts),
        save_every=run["checkpoints"].get("save_every"), device=device, scratch=output.parent, start=start,
    )  # fmt: skip
    write_part(output, arrays, {"device": str(device), "provenance": provenance(run, inputs)})


def retrain_by_command(snakemake) -> None:
    """The run's training command retrains each subset (its {subset} file), pinned as its training."""
    inp, wc = snakemake.input, snakemake.wildcards
    job = CommandPart(
        wc.run, snakemake.config["runs"][wc.run], snakemake.params.run, snakemake.params.lds,
        int(wc.index), int(wc.epoch), int(wc.part), int(wc.nparts), [Path(f) for f in inp.files],
        read_any_dataset(inp.dataset), Path(inp.data[0]), inp.class_order,
        job_device(snakemake.config["device"], job_resources(snakemake)), snakemake.threads,
        snakemake.log[0] if snakemake.log else None,
    )  # fmt: skip
    arrays, info, retraining = command_part(job)
    write_part(snakemake.output.part, arrays, info)
    remove_subset_folders(retraining, arrays["subset_ids"])


if __name__ == "__main__":
    run_script(main, "lds_retrain", globals().get("snakemake"))
