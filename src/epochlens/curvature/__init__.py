"""Per-image input-loss curvature: the estimator, multi-process runs, shard files, sample dynamics."""
