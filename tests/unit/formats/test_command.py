"""The user's training command (epochlens.formats.command): its template, the files it depends on,
pinning to a commit of a real (temporary) git repository, running it with streamed output, and
collecting its checkpoints. No Snakemake, no torch."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epochlens.formats import command as cmd
from epochlens.formats.command import CommandError, CommandSpec

TEMPLATE = "python code/train.py --config code/configs/a.json --seed {seed} --out {output} --resume {resume}"


def spec(command: str = TEMPLATE, **kw) -> CommandSpec:
    return CommandSpec(
        run="q", command=command, path=kw.pop("path", "ckpt_{epoch}.pt"), key="runs.q.checkpoints", **kw
    )


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@e.org", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding the user's repository code/: a script importing its package,
    configs, one commit; the working directory is the current directory."""
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "configs").mkdir()
    (code / "train.py").write_text("import json\nfrom pkg.model import build\n")
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "model.py").write_text("from .layers import block\n")
    (code / "pkg" / "layers.py").write_text("import torch\n")
    (code / "configs" / "a.json").write_text("{}")
    (code / ".gitignore").write_text("*.log\n")
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-q", "-m", "init")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cmd.PINNED_ENV, "{}")  # restored after the test
    return tmp_path


# -- template ------------------------------------------------------------------------------------


def test_placeholders_are_checked_with_the_key_and_the_list():
    spec().check()
    with pytest.raises(CommandError, match=r"runs\.q\.checkpoints\.command: unknown placeholder.*\{sed\}"):
        spec("train --seed {sed} --out {output}").check()
    with pytest.raises(CommandError, match="has no {output}"):
        spec("train --seed {seed}").check()
    with pytest.raises(CommandError, match=r"runs\.q\.checkpoints\.path"):
        spec(path="ckpt.pt").check()
    with pytest.raises(CommandError, match="relative"):
        spec(path="/abs/ckpt_{epoch}.pt").check()
    with pytest.raises(CommandError, match="not a placeholder"):
        spec("train {output!r}").check()
    assert spec("echo ${{HOME}} {output}").placeholders == {"output"}


def test_values_are_shell_quoted_and_kept_placeholders_stay():
    line = cmd.fill_command("run --out {output} --i {index:03d}", {"output": "/a b/c", "index": 7})
    assert line == "run --out '/a b/c' --i 007"
    assert cmd.fill_command("x {index} {output}", {"index": 2}, keep={"output"}) == "x 2 {output}"
    with pytest.raises(CommandError, match="no value"):
        cmd.fill_command("x {data}", {})


def test_params_hold_the_seed_only_where_the_command_uses_it_and_never_a_commit():
    run = {
        "checkpoints": {"command": TEMPLATE, "path": "c_{epoch}.pt"},
        "epochs": [5, 0],
        "train": {"seed": 3},
    }
    assert cmd.command_params(run) == {
        "command": TEMPLATE,
        "path": "c_{epoch}.pt",
        "epochs": [0, 5],
        "seed": 3,
    }
    run["checkpoints"]["command"] = "train --out {output}"
    assert "seed" not in cmd.command_params(run)
    assert cmd.seed_of(run, 4) == 7


# -- files ---------------------------------------------------------------------------------------


def test_the_files_named_and_the_modules_a_script_imports_are_found(project: Path):
    files = cmd.command_files(spec(), index=0, seed=0)
    rel = sorted(p.relative_to(project).as_posix() for p in files)
    assert rel == [
        "code/configs/a.json",
        "code/pkg/__init__.py",
        "code/pkg/layers.py",
        "code/pkg/model.py",
        "code/train.py",
    ]


def test_interpreters_options_and_index_placeholders(project: Path):
    (project / "code" / "configs" / "run-2.json").write_text("{}")
    line = f"{sys.executable} -m code.train --config=code/configs/run-{{index}}.json --out {{output}}"
    (project / "code" / "__init__.py").write_text("")
    found = cmd.named_files(spec(line), index=2, seed=0)
    assert [p.relative_to(project).as_posix() for p in found] == [
        "code/__init__.py",
        "code/train.py",
        "code/configs/run-2.json",
    ]  # not the interpreter


def test_a_missing_config_or_listed_file_is_an_error_naming_it(project: Path):
    with pytest.raises(CommandError, match=r"names \['code/configs/q101\.json'\].*\{output\} folder"):
        cmd.named_files(spec(TEMPLATE.replace("a.json", "q101.json")), 0, 0)
    with pytest.raises(CommandError, match=r"runs\.q\.checkpoints\.files: code/extra\.yaml does not exist"):
        cmd.command_files(spec(files=("code/extra.yaml",)), 0, 0)


# -- pinning -------------------------------------------------------------------------------------


def state_of(project: Path, command: str = TEMPLATE) -> cmd.RepoState:
    s = spec(command, repository="code")
    files = cmd.command_files(s, 0, 0)
    return cmd.repository_state(cmd.repository_root(s), files)


def test_a_clean_repository_is_pinned_to_its_commit(project: Path):
    state = state_of(project)
    assert state.commit == git(project / "code", "rev-parse", "HEAD")
    assert not state.dirty and cmd.pin_problems(state) == []
    assert state.record()["commit"] == state.commit


def test_changes_untracked_neighbours_and_uncommitted_files_are_refused_with_the_override(project: Path):
    code = project / "code"
    (code / "pkg" / "layers.py").write_text("import torch  # edited\n")
    (code / "notes.txt").write_text("next to train.py")
    (code / "configs" / "new.json").write_text("{}")
    (code / "run.log").write_text("ignored")
    (code / "deep").mkdir()
    (code / "deep" / "far.txt").write_text("not next to a file the command uses")
    state = state_of(project, TEMPLATE.replace("a.json", "new.json"))
    problems = cmd.pin_problems(state)
    assert problems == [
        "modified: pkg/layers.py",
        "not committed: configs/new.json (the command uses it)",
        "untracked: notes.txt (next to a file the command uses)",
    ]
    message = cmd.pin_error(spec(), state, problems)
    assert "runs.q.checkpoints.allow_dirty: true" in message and f"git -C {code}" in message
    assert cmd.pin_problems(state, allow_dirty=True) == []
    assert state.record()["dirty"] is True


def test_ignored_and_outside_files_are_not_pinned(project: Path):
    (project / "code" / "configs" / "local.log").write_text("ignored by .gitignore")
    (project / "other.json").write_text("{}")
    state = state_of(project, TEMPLATE + " --local code/configs/local.log --x other.json")
    assert cmd.pin_problems(state) == []
    assert "configs/local.log" in state.unpinned and str(project / "other.json") in state.unpinned


def test_no_repository_and_no_commit(project: Path, tmp_path_factory):
    bare = tmp_path_factory.mktemp("nogit")
    assert cmd.repository_root(spec(repository=str(bare))) is None
    assert "not in a git repository" in cmd.pin_problems(cmd.repository_state(None, []))[0]
    git(bare, "init", "-q")
    state = cmd.repository_state(cmd.repository_root(spec(repository=str(bare))), [])
    assert "no commit yet" in cmd.pin_problems(state)[0]
    with pytest.raises(CommandError, match=r"runs\.q\.checkpoints\.repository"):
        cmd.repository_root(spec(repository="nowhere"))


def test_the_planned_commit_is_kept_for_the_jobs_and_a_moved_head_is_an_error(project: Path):
    state = state_of(project)
    assert cmd.pin_commit(state) == state.commit
    assert json.loads(os.environ[cmd.PINNED_ENV]) == {str(state.root): state.commit}
    assert cmd.moved_error(spec(), state, state.commit) is None
    (project / "code" / "README").write_text("x")
    git(project / "code", "add", "README")
    git(project / "code", "commit", "-q", "-m", "more")
    moved = state_of(project)
    assert cmd.pin_commit(moved) == state.commit  # the first pin stays (a cluster job inherits it)
    assert state.commit[:12] in cmd.moved_error(spec(), moved, state.commit)


def test_a_job_runs_when_an_output_is_missing_or_an_input_has_changes(project: Path, tmp_path: Path):
    out = tmp_path / "ckpt.pt"
    state = state_of(project)
    files = [project / "code" / "train.py"]
    assert cmd.will_run([out], files, state)
    out.write_bytes(b"x")
    assert not cmd.will_run([out], files, state)
    (project / "code" / "train.py").write_text("# edited\n")
    assert cmd.will_run([out], files, state_of(project))
    assert not cmd.will_run([out], [project / "code" / "pkg" / "model.py"], state_of(project))


# -- running -------------------------------------------------------------------------------------


def test_output_is_streamed_line_by_line_while_the_command_runs(tmp_path: Path):
    """The command waits for a file that the stream creates when it sees the first line: it ends
    only if that line reached the stream before the command ended."""
    flag = tmp_path / "flag"

    class Releasing(io.StringIO):
        def write(self, text: str) -> int:
            if "ready" in text:
                flag.touch()
            return super().write(text)

    stream = Releasing()
    wait = f"for i in $(seq 200); do [ -f {flag} ] && break; sleep 0.02; done; [ -f {flag} ] || exit 9"
    script = f"echo ready; {wait}; echo done >&2"
    result = cmd.run_streamed(script, stream=stream)
    assert result.returncode == 0
    assert stream.getvalue() == "ready\ndone\n"
    assert result.tail == ["ready", "done"]


def test_progress_redraws_are_thinned_and_the_tail_is_kept():
    stream = io.StringIO()
    result = cmd.run_streamed(
        "printf 'a\\r10%%\\r20%%\\r30%%\\nend\\r\\n'; for i in 1 2 3 4 5; do echo line $i; done; exit 4",
        stream=stream,
        tail=3,
        redraw_every=3600,
    )
    assert stream.getvalue().splitlines() == [
        "a",
        "30%",
        "end",
        "line 1",
        "line 2",
        "line 3",
        "line 4",
        "line 5",
    ]
    assert result.returncode == 4 and result.status == "exited with status 4"
    assert result.tail == ["line 3", "line 4", "line 5"]
    message = cmd.failure_message(spec(), 2, "python train.py", result, "logs/train.log", "/r")
    assert (
        "(index 2) exited with status 4" in message and "| line 5" in message and "logs/train.log" in message
    )


def test_a_command_killed_by_a_signal_says_so():
    result = cmd.run_streamed("kill -9 $$", stream=io.StringIO())
    assert result.status == "was killed by SIGKILL"


# -- attempts and checkpoints --------------------------------------------------------------------


def test_resume_folders_are_kept_for_the_same_key_only(tmp_path: Path):
    state, out, resume = tmp_path / "s.json", tmp_path / "out", tmp_path / "resume"
    assert not cmd.prepare_attempt(state, [out, resume], "k1")
    (resume / "state.pt").write_bytes(b"s")
    assert cmd.prepare_attempt(state, [out, resume], "k1")
    assert (resume / "state.pt").is_file()
    assert not cmd.prepare_attempt(state, [out, resume], "k2")  # other command, files or data
    assert list(resume.iterdir()) == [] and out.is_dir()


def test_checkpoints_are_linked_into_the_layout_and_missing_ones_are_named(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    s = spec(path="e{epoch:03d}/model.pt")
    (out / "e000").mkdir()
    (out / "e000" / "model.pt").write_bytes(b"zero")
    (out / "metrics.json").write_text("{}")
    dest = {0: tmp_path / "ckpt" / "epoch_0000.pt", 10: tmp_path / "ckpt" / "epoch_0010.pt"}
    with pytest.raises(CommandError) as err:
        cmd.collect_checkpoints(s, 0, out, dest)
    message = str(err.value)
    assert "did not write 1 of the 2 checkpoints" in message and "e010/model.pt (epoch 10)" in message
    assert "holds: e000/model.pt, metrics.json" in message and "{output}/e{epoch:03d}/model.pt" in message
    assert not dest[0].exists()  # nothing published unless all are there
    (out / "e010").mkdir()
    (out / "e010" / "model.pt").write_bytes(b"ten")
    cmd.collect_checkpoints(s, 0, out, dest)
    assert dest[10].read_bytes() == b"ten" and os.path.samefile(dest[10], out / "e010" / "model.pt")
    kept = cmd.keep_other_files(
        out, [out / "e000" / "model.pt", out / "e010" / "model.pt"], tmp_path / "extra"
    )
    assert kept == ["metrics.json"] and (tmp_path / "extra" / "metrics.json").read_text() == "{}"


def test_the_job_log_says_which_python_the_command_finds(tmp_path, monkeypatch):
    """The command runs ``python`` from the PATH of the shell that started snakemake: the job's log
    says which one, and when it is not the pipeline's own (a system python without torch)."""
    import shutil

    from epochlens.training_command import python_on_path

    other = tmp_path / "bin"
    other.mkdir()
    (other / "python").symlink_to(shutil.which("python3", path="/usr/bin:/bin") or sys.executable)
    monkeypatch.setenv("PATH", str(other))
    said = python_on_path("python train.py --out o")
    assert f"python is {other / 'python'}" in said and f"not the pipeline's own {sys.executable}" in said
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert "(the pipeline's own python)" in python_on_path("cd x && python3 -u train.py")
    assert python_on_path(f"{sys.executable} train.py") is None  # a path: what it says
