"""Interpreting a run's configuration (torch-free)."""
