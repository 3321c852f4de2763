"""Settings of the ablations (torch-free: the workflow reads them while planning).

Fields whose metadata says ``execution`` do not change the results (batch size): the workflow
leaves them out of the rules' params, so changing them reruns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epochlens.errors import ConfigError
from epochlens.resources import PRECISIONS

MODES = ("zero", "mean")


@dataclass
class AblationSettings:
    """Which unit groups are ablated, and how."""

    blocks: list[str] | None = field(
        default=None,
        metadata={"help": "module names whose outputs are ablated; None: every block output"},
    )
    channel_groups: int = field(
        default=4,
        metadata={"help": "contiguous channel groups per block (0: none; >= channels: one per channel)"},
    )
    whole_blocks: bool = field(default=True, metadata={"help": "also ablate each block as a whole"})
    modes: tuple[str, ...] = field(default=MODES, metadata={"help": "zero and/or mean ablation"})
    precision: str = field(
        default="float32",
        metadata={"help": "forward passes in float32, or autocast to bfloat16 / float16 (large models)"},
    )
    batch_size: int = field(
        default=256, metadata={"help": "images per forward pass (bounds memory)", "execution": True}
    )
    parts: int = field(
        default=1, metadata={"help": "jobs per checkpoint, a block of units each", "execution": True}
    )
    part: int = field(default=0, metadata={"help": "this job's block (0 .. parts - 1)", "execution": True})

    def __post_init__(self) -> None:
        self.modes = tuple(self.modes)
        if isinstance(self.blocks, str):
            self.blocks = [self.blocks]
        problems = []
        if not self.modes or not set(self.modes) <= set(MODES) or len(set(self.modes)) != len(self.modes):
            problems.append(f"modes={list(self.modes)} must be distinct values of {list(MODES)}")
        if self.channel_groups < 0:
            problems.append(f"channel_groups={self.channel_groups} must be >= 0")
        if self.channel_groups == 0 and not self.whole_blocks:
            problems.append("channel_groups=0 and whole_blocks=false leave nothing to ablate")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} must be one of {list(PRECISIONS)}")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be >= 1")
        if not 0 <= self.part < self.parts:
            problems.append(f"part {self.part} of parts={self.parts}: parts must be >= 1, part below it")
        if problems:
            raise ConfigError("ablation settings: " + "; ".join(problems) + ". Fix the config.")

    def share(self, units: list) -> list:
        """This job's contiguous block of ``units`` (in table order; one part: all); ConfigError
        where it has none (more parts than units)."""
        n = len(units)
        block = units[self.part * n // self.parts : (self.part + 1) * n // self.parts]
        if not block:
            raise ConfigError(f"ablation.parts={self.parts} is more than the {n} unit groups: lower it.")
        return block
