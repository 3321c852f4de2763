"""Rule train_<run> of a run with checkpoints.source: command: the user's training command for one
replicate index, run from a commit of its git repository, its output streamed into the job's log,
its checkpoints put into the run's layout (epochlens.formats.command).

By hand, from the run's working directory: python scripts/train_command.py run=q001 index=0
"""

import platform
import shutil
import time
from pathlib import Path

import numpy as np
from _helpers import run_script

from epochlens.atomic import write_json
from epochlens.formats import command as cmd
from epochlens.layout import RESULTS
from epochlens.provenance import config_hash, file_sha256, provenance
from epochlens.runner import log


def main(snakemake) -> None:
    run_name = snakemake.rule.removeprefix("train_")  # rule train_<run>
    run = snakemake.config["runs"][run_name]
    spec = cmd.CommandSpec.from_config(run_name, run)
    params = snakemake.params.command
    index = int(snakemake.wildcards.index)
    seed = cmd.seed_of(run, index)
    files = [Path(f) for f in snakemake.input.files]

    # Pinned: the code must still be the commit the run was planned at, with nothing uncommitted.
    state = cmd.job_repository_state(spec, files)

    # {output} and {resume} survive failed attempts (outside the job's outputs, which Snakemake
    # deletes), unless they were made for another command, other files or other data.
    output = Path(RESULTS.command_output(run_name, index)).resolve()
    resume = Path(RESULTS.resume_dir(run_name, index)).resolve()
    inputs = cmd.file_digests(files, state.root)
    if snakemake.input.data:
        inputs["{data}"] = file_sha256(snakemake.input.data[0])
    key = cmd.fingerprint({"params": params, "index": index, "seed": seed, "inputs": inputs})
    resumed = cmd.prepare_attempt(RESULTS.command_state(run_name, index), [output, resume], key)
    values = {
        "index": index,
        "seed": seed,
        "output": output,
        "resume": resume,
        "data": Path(snakemake.input.data[0]).resolve() if snakemake.input.data else "",
        "threads": snakemake.threads,
    }
    if spec.uses_subset:  # the run's own training: every position of {data}'s x_train but the holdout
        with np.load(snakemake.input.data[0]) as data:
            holdout = data["holdout"]
        positions = cmd.training_positions(holdout)
        values["subset"] = cmd.write_subset(RESULTS.command_subset(run_name, index), positions)
        log.info("index %d: {subset} lists %d of %d training samples", index, len(positions), len(holdout))
    line = cmd.fill_command(spec.command, values)
    log.info(
        "index %d: %s at commit %s%s: %s",
        index,
        "resuming (the command's {resume} and {output} folders of an earlier attempt are kept)"
        if resumed
        else "training",
        state.commit,
        " (dirty)" if state.dirty else "",
        line,
    )

    started = time.time()
    result = cmd.run_streamed(line)
    if result.returncode != 0:
        raise cmd.CommandError(
            cmd.failure_message(
                spec, index, line, result, snakemake.log[0] if snakemake.log else None, resume
            )
        )
    epochs = [int(e) for e in params["epochs"]]
    published = cmd.collect_checkpoints(
        spec, index, output, dict(zip(epochs, snakemake.output.checkpoints, strict=True))
    )
    written = [output / spec.checkpoint_name(index, e) for e in epochs]
    others = cmd.keep_other_files(output, written, snakemake.output.train_output)
    write_json(
        snakemake.output.metadata,
        {
            "index": index,
            "seed": seed,
            "command": line,
            "command_template": spec.command,
            "git": state.record(),
            "config_hash": config_hash(params),
            "exit_status": result.returncode,
            "duration_seconds": round(result.seconds, 3),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "resumed": resumed,
            "host": platform.node(),
            "checkpoints": {str(e): file_sha256(p) for e, p in published.items()},
            "train_output": others,
            **({"subset_samples": len(positions)} if spec.uses_subset else {}),
            "provenance": provenance(params, inputs),
        },
    )
    log.info(
        "index %d: %d checkpoints in %s", index, len(published), Path(snakemake.output.checkpoints[0]).parent
    )
    shutil.rmtree(Path(RESULTS.command_state(run_name, index)).parent, ignore_errors=True)  # .resume/


if __name__ == "__main__":
    run_script(main, "train_{run}", globals().get("snakemake"))
