"""epochlens: per-sample analyses of a training run (checkpoints + data set).

The library is pure Python/PyTorch and knows nothing of Snakemake; the workflow's scripts are thin
wrappers around the functions here.
"""

__version__ = "0.1.0"
