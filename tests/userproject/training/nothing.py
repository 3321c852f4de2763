"""A training script that exits 0 but saves its checkpoints under another name."""

import sys
from pathlib import Path

Path(sys.argv[1], "model_final.pt").write_bytes(b"not a checkpoint")
print("done", flush=True)
