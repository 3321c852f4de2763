"""Rule train_<run> of a run with checkpoints.source: command: the user's training command for one
replicate index, run from a commit of its git repository, its output streamed into the job's log,
its checkpoints put into the run's layout (epochlens.training_command, epochlens.formats.command).

By hand, from the run's working directory: python scripts/train_command.py run=q001 index=0
"""

from pathlib import Path

from _helpers import run_script

from epochlens.atomic import write_json
from epochlens.training_command import CommandTraining, forget_attempts, train_by_command


def main(snakemake) -> None:
    run_name = snakemake.rule.removeprefix("train_")  # rule train_<run>
    inp, out = snakemake.input, snakemake.output
    job = CommandTraining(
        run_name=run_name,
        run=snakemake.config["runs"][run_name],
        params=snakemake.params.command,
        index=int(snakemake.wildcards.index),
        files=[Path(f) for f in inp.files],
        data=Path(inp.data[0]) if inp.data else None,
        checkpoints=list(out.checkpoints),
        train_output=out.train_output,
        threads=snakemake.threads,
        log_file=snakemake.log[0] if snakemake.log else None,
    )
    write_json(out.metadata, train_by_command(job))
    forget_attempts(run_name, job.index)  # once the record is written


if __name__ == "__main__":
    run_script(main, "train_{run}", globals().get("snakemake"))
