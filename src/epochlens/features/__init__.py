"""Cached per-layer features of a checkpoint and the representations built from them."""
