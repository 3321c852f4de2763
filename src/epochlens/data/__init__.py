"""Data sets: the supported sources and the dataset.h5 contract."""
