"""Linear probes on cached features."""
