# Helpers of rules/train.smk: input functions, params and targets.


def get_trained_runs():
    return [
        r
        for r, spec in config["runs"].items()
        if spec["checkpoints"]["source"] == "train"
    ]


def get_trained_checkpoints(run):
    """Output paths of run's training job (``{index}`` left as a wildcard)."""
    epochs = run_config.checkpoint_epochs(config["runs"][run])
    return [layout.checkpoint(run, "{index}", e) for e in epochs]


def get_train_resources():
    """Resources of a training job on a cluster: one GPU (the standard `gpu` resource, which the
    SLURM executor requests with --gpus; none with device: cpu) with 4 CPU cores (--cpus-per-gpu), host memory in MB and
    wall time in minutes; the same as the GPU rules in profiles/slurm/config.yaml, except that the
    time does not grow with the attempt: a retried training resumes where it stopped. The training rules are named after the config's
    runs (train_<run>), so a profile cannot name them in advance: a profile overrides them per run
    with set-resources: train_<run>: {...}. Local runs ignore them unless --resources limits one
    (e.g. --resources gpu=1: one GPU job at a time on a one-GPU machine).
    """
    return {**get_gpu_resources(), "cpus_per_gpu": 4, "mem_mb": 16000, "runtime": 240}


# -- Your own training command (checkpoints.source: command; epochlens.formats.command) ----------

from epochlens.formats import command as user_command


def get_command_runs():
    return [
        r
        for r, spec in config["runs"].items()
        if spec["checkpoints"]["source"] == "command"
    ]


@cache
def get_command_spec(run):
    return user_command.CommandSpec.from_config(run, config["runs"][run])


def get_command_checkpoints(run):
    """Output paths of run's command job: the checkpoints of its epochs (``{index}`` left as a
    wildcard), in the order of the params' epochs."""
    return [layout.checkpoint(run, "{index}", e) for e in get_command_epochs(run)]


def get_command_epochs(run):
    return run_config.checkpoint_epochs(config["runs"][run])


def get_command_data(run):
    """The ``{data}`` export, an input of the run's command jobs where the command reads it (or
    its ``{subset}``, every non-holdout position, is made from it)."""
    return [layout.training_data(run)] if get_command_spec(run).needs_data else []


def get_command_params(run):
    """What the command's checkpoints depend on besides its files and data (epochlens.formats.
    command.command_params): never the commit, so a commit that leaves the files alone retrains
    nothing."""
    return user_command.command_params(config["runs"][run])


@cache
def _command_repository(run):
    return user_command.repository_root(get_command_spec(run))


@cache
def _repository_state(root, files):
    return user_command.repository_state(root, list(files))


_warned_dirty = set()


def _finished_command_job(run, index):
    """Whether every output of run's command job for ``index`` exists."""
    outputs = [layout.checkpoint(run, index, e) for e in get_command_epochs(run)]
    return all(
        os.path.exists(path) for path in outputs + [layout.train_metadata(run, index)]
    )


def _finished_as_they_are(run, state, files, edit):
    """The inputs of a finished command job whose repository has uncommitted changes (``edit``:
    the error naming them where they are the job's files, else its files as they are: a commit of
    them still plans the job, which refuses as it starts): its files as ancient, so that neither
    it nor anything reading its checkpoints reruns for them (the model code, also the analysis
    jobs' input, is ancient there: get_model_code): every stage stays on the checkpoints and the
    model that trained them until the edit is committed. Raising here instead let Snakemake drop
    some readers of the checkpoints (their outputs taken as they are, whatever else changed) and
    plan others with the edited model. A job that has to run for another reason still refuses as
    it starts. Warned once per run."""
    if run not in _warned_dirty:
        _warned_dirty.add(run)
        logger.warning(
            f"{edit}\nUntil then the finished checkpoints of runs.{run} are analysed as they "
            "are, by every stage: its training does not run again (the pipeline trains committed "
            "code only), nor does a job that builds its model."
            if edit
            else f"runs.{run}: the repository {state.root} has uncommitted changes; the run's "
            "finished trainings stay as they are, but a training job of it that has to run "
            "refuses to until they are committed (or allow_dirty: true)."
        )
    return [ancient(str(f)) if edit else str(f) for f in files]


def get_command_files(run):
    """Input function of train_<run>: the files the command depends on (it names, its scripts
    import, checkpoints.files, the model's sources), so that editing them trains again; and the pin
    check: an unfinished job with uncommitted changes of the code's repository, or one to run
    after the repository moved away from the commit this run was planned at, fails the planning
    with the fix (the job checks again when it starts); a finished one stays as it is
    (_finished_as_they_are)."""

    def command_files(wildcards):
        spec, cfg = get_command_spec(run), config["runs"][run]
        index = int(wildcards.index)
        roots = (
            [cfg["model"]["project_path"]] if cfg["model"].get("project_path") else []
        )
        try:
            repository = _command_repository(run)
            files = user_command.command_files(
                spec,
                index,
                user_command.seed_of(cfg, index),
                roots=roots,
                within=[repository] if repository else [],
            )
            files = sorted({*files, *map(Path, model_sources(cfg))})
            state = _repository_state(repository, tuple(files))
        except user_command.CommandError as exc:
            raise WorkflowError(str(exc)) from None
        problems = user_command.pin_problems(state, spec.allow_dirty)
        planned = user_command.pin_commit(state)
        moved = (
            None
            if spec.allow_dirty or planned is None
            else user_command.moved_error(spec, state, planned)
        )
        if problems or moved:
            outputs = [
                layout.checkpoint(run, index, e) for e in get_command_epochs(run)
            ]
            outputs.append(layout.train_metadata(run, index))
            edited = user_command.will_run(outputs, files, state)
            if not _finished_command_job(run, index) or (moved and edited):
                raise WorkflowError(
                    moved or user_command.pin_error(spec, state, problems)
                )
            if problems:
                message = user_command.pin_error(spec, state, problems)
                return _finished_as_they_are(run, state, files, edited and message)
        return [str(f) for f in files]

    command_files.__name__ = f"get_command_files_{run}"
    return command_files
