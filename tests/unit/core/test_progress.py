"""Progress that a person can follow in a job's log file: plain lines with rate and ETA where the
stream is not a terminal, tqdm's live bar where it is."""

from __future__ import annotations

import io
import re

from epochlens.progress import LineProgress, progress_bar
from epochlens.runner import run_step

LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (?P<desc>\w+): (?P<n>\d+)/(?P<total>\d+) (?P<unit>\w+) "
    r"\((?P<pct>\d+)%\), (?P<rate>[^,]+), elapsed (?P<elapsed>[\d:]+), ETA (?P<eta>[\d:?]+)(?P<post>.*)$"
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def parse(text: str) -> list[dict]:
    lines = text.splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), text
    assert "\r" not in text
    return [m.groupdict() for m in parsed]


def test_a_line_every_5_percent_of_a_loop_on_a_log_stream():
    log = io.StringIO()
    for _ in progress_bar(range(200), file=log, desc="curvature", unit="sample"):
        pass
    lines = parse(log.getvalue())
    assert [int(x["n"]) for x in lines] == list(range(10, 201, 10))
    assert [int(x["pct"]) for x in lines] == list(range(5, 101, 5))
    assert {x["unit"] for x in lines} == {"samples"} and {x["total"] for x in lines} == {"200"}
    assert lines[-1]["eta"] == "0:00:00"


def test_uneven_batches_give_at_most_one_line_per_update():
    log = io.StringIO()
    bar = progress_bar(total=1000, file=log, desc="features", unit="image")
    for lo in range(0, 1000, 128):
        bar.update(min(128, 1000 - lo))
    bar.close()
    assert [int(x["n"]) for x in parse(log.getvalue())] == [128, 256, 384, 512, 640, 768, 896, 1000]


def test_one_line_per_epoch_with_rate_eta_and_postfix():
    clock, log = FakeClock(), io.StringIO()
    bar = LineProgress(total=4, file=log, desc="training", unit="epoch", line_every=0, clock=clock)
    for epoch in range(4):
        clock.now += 90  # 1.5 minutes an epoch
        bar.set_postfix(task=epoch // 2, holdout=f"{0.25 * epoch:.3f}", refresh=False)
        bar.update(1)
    bar.close()
    lines = parse(log.getvalue())
    assert [(x["n"], x["pct"], x["rate"], x["elapsed"], x["eta"]) for x in lines] == [
        ("1", "25", "90 s/epoch", "0:01:30", "0:04:30"),
        ("2", "50", "90 s/epoch", "0:03:00", "0:03:00"),
        ("3", "75", "90 s/epoch", "0:04:30", "0:01:30"),
        ("4", "100", "90 s/epoch", "0:06:00", "0:00:00"),
    ]
    assert lines[2]["post"] == ", holdout=0.500, task=1"


def test_a_slow_loop_still_reports_every_max_silence_seconds():
    """10 of 1000 samples per 100 s: 5% takes 500 s; a line comes every 300 s or more."""
    clock, log = FakeClock(), io.StringIO()
    bar = LineProgress(total=1000, file=log, desc="scores", unit="sample", max_silence=300, clock=clock)
    for _ in range(10):
        clock.now += 100
        bar.update(10)
    bar.close()
    lines = parse(log.getvalue())
    # 300 s (n=30), 500 s (5% at n=50), 800 s (n=80), and the end (n=100, not a new 5% step)
    assert [int(x["n"]) for x in lines] == [30, 50, 80, 100]
    assert lines[0]["rate"] == "10 s/sample" and lines[0]["eta"] == "2:41:40"


def test_disabled_and_terminal_bars():
    log = io.StringIO()
    bar = progress_bar(total=10, file=log, disable=True)
    bar.update(10)
    bar.close()
    assert log.getvalue() == ""

    terminal = Terminal()
    bar = progress_bar(total=10, file=terminal, desc="live")
    assert not isinstance(bar, LineProgress)
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert "\r" in terminal.getvalue() and "10/10" in terminal.getvalue()


def test_a_steps_log_file_gets_the_lines(tmp_path, capsys):
    """Under run_step (every rule's script), stderr is copied to the job's log: lines, not redraws."""
    log_path = tmp_path / "logs/job.log"

    def main() -> None:
        for _ in progress_bar(range(40), desc="ablations", unit="group"):
            pass

    run_step(main, log_path)
    lines = parse(log_path.read_text())
    assert [int(x["n"]) for x in lines] == list(range(2, 41, 2))
    assert capsys.readouterr().err.count("ablations: ") == 20  # the terminal gets them too
