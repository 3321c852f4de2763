"""The data-quality study: corrupted training data, queries and detection of the corrupted images."""
