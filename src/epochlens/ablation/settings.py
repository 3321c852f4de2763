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

    def __post_init__(self) -> None:
        self.modes = tuple(self.modes)
        if isinstance(self.blocks, str):
            self.blocks = [self.blocks]
        problems = []
        if (
            not self.modes
            or any(m not in MODES for m in self.modes)
            or len(set(self.modes)) != len(self.modes)
        ):
            problems.append(f"modes={list(self.modes)} must be distinct values of {list(MODES)}")
        if self.channel_groups < 0:
            problems.append(f"channel_groups={self.channel_groups} must be >= 0")
        if self.channel_groups == 0 and not self.whole_blocks:
            problems.append("channel_groups=0 and whole_blocks=false leave nothing to ablate")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} must be one of {list(PRECISIONS)}")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be >= 1")
        if problems:
            raise ConfigError("ablation settings: " + "; ".join(problems) + ". Fix the config.")
