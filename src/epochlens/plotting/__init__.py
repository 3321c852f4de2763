"""Figures of every stage (matplotlib; never imports torch)."""
