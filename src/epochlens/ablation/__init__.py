"""Ablations of unit groups and their effect on old versus new classes."""
