"""Layer groups: the tracked layers fitted and scored a group at a time, so that a job holds the
factors of one group, not of the whole model (a 7B model's factors take ~370 GB in float64).

:func:`plan_groups` cuts the tracked layers, in module order, into consecutive groups whose factors
take at most ``settings.factor_memory_gb`` while they are fitted (:func:`layer_bytes`; a layer
larger than that is a group of its own). Each pass of the fitting and of the scores then runs once
per group: the whole model's forward and backward passes, with the group's layers tracked. The
scores add up over the groups, since every method is block-diagonal over layers (self-influence
and pairwise influence are sums over layers of g_lᵀ P_l g_l'). A sample left out of a group's sums
(NaN/Inf or vanished gradients in its layers) is left out of that group's only.

A file of factors in several groups (``factors.pt``) is a zip archive (stored, dated 1980 so that
the same factors give the same bytes) of ``groups.json`` ({"format", "key", "groups": [[layer
names], ...]}) and ``group-<g>.pt`` per group, each in the form
:func:`epochlens.influence.io.save_factors` writes; factors in one group are that form itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from epochlens.atomic import atomic_path
from epochlens.errors import FactorCacheError
from epochlens.influence.factors import InfluenceFactors
from epochlens.influence.io import check_key, factor_object, factors_from_object, load_factors, save_factors
from epochlens.influence.layers import LayerInfo
from epochlens.influence.settings import InfluenceSettings

GROUPS_FORMAT = "epochlens-influence-factor-groups-v1"
INDEX = "groups.json"
_DATE = (1980, 1, 1, 0, 0, 0)


@dataclasses.dataclass
class FactorFit:
    """Factors fitted a layer group at a time: the groups' layers, the cache key, ``groups`` (fits
    each group as it is iterated) and the spectra of those fitted so far."""

    names: list[list[str]]
    key: dict
    groups: Iterator[InfluenceFactors]
    spectra: list[pd.DataFrame]

    def spectrum(self) -> pd.DataFrame:
        return pd.concat(self.spectra, ignore_index=True)


def layer_bytes(info: LayerInfo, method: str) -> int:
    """Bytes of one layer's float64 factors while they are fitted: for K-FAC its covariance sums,
    covariances and eigenvectors (3 (in² + out²)), EK-FAC adds the correction sums and corrected
    eigenvalues (2 out·in), the diagonal method holds those two only."""
    square, rect = info.in_dim**2 + info.out_dim**2, info.out_dim * info.in_dim
    return 8 * {"ekfac": 3 * square + 2 * rect, "kfac": 3 * square, "diagonal": 2 * rect}.get(method, 0)


def plan_groups(layers: Mapping[str, LayerInfo], method: str, budget_gb: float) -> list[list[str]]:
    """The tracked ``layers`` (module order) in consecutive groups of at most ``budget_gb`` GiB of
    factors each (:func:`layer_bytes`)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, info in layers.items():
        need = layer_bytes(info, method)
        if groups[-1] and size + need > budget_gb * 2**30:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += need
    return groups


def group_settings(settings: InfluenceSettings, names: list[str]) -> InfluenceSettings:
    """``settings`` tracking exactly the layers ``names`` (fnmatch's special characters escaped)."""
    return dataclasses.replace(settings, layers=tuple(re.sub(r"([*?[])", r"[\1]", n) for n in names))


def save_factor_groups(
    path: str | Path, groups: Iterable[InfluenceFactors], names: list[list[str]], key: dict
) -> None:
    """Write the factors of the layer groups ``names`` as ``groups`` yields them (one group in
    memory at a time), atomically; a single group as :func:`save_factors` writes it."""
    if len(names) == 1:
        save_factors(path, next(iter(groups)))
        return
    index = json.dumps({"format": GROUPS_FORMAT, "key": key, "groups": names}, sort_keys=True)
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(zipfile.ZipInfo(INDEX, _DATE), index)
        fitted = iter(groups)  # not enumerate(): its reused tuple would hold the last group
        for g, planned in enumerate(names):
            factors = next(fitted)
            if list(factors.layers) != planned:
                raise ValueError(f"group {g}: layers {list(factors.layers)}, planned {planned}")
            with archive.open(zipfile.ZipInfo(f"group-{g:03d}.pt", _DATE), "w", force_zip64=True) as f:
                torch.save(factor_object(factors), f)
            del factors  # written: not held while the next group is fitted


def group_names(path: str | Path) -> list[list[str]] | None:
    """The layer groups of a factors file; None for factors in one group (or no such archive)."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        if INDEX not in archive.namelist():
            return None
        return json.loads(archive.read(INDEX))["groups"]


def factor_groups(path: str | Path, expected_key: dict | None = None) -> Iterator[InfluenceFactors]:
    """The factors of each layer group of ``path``, read as iterated (one held at a time); with
    ``expected_key``, checked against it. Factors in one group: that group."""
    path = Path(path)
    if group_names(path) is None:
        yield load_factors(path, expected_key)
        return
    with zipfile.ZipFile(path) as archive:
        index = json.loads(archive.read(INDEX))
        if index.get("format") != GROUPS_FORMAT:
            raise FactorCacheError(f"{path}: format {index.get('format')!r}; delete it and fit again")
        if expected_key is not None:
            check_key(index["key"], expected_key, path)
        for g in range(len(index["groups"])):
            with archive.open(f"group-{g:03d}.pt") as f:
                load = lambda f=f: torch.load(f, map_location="cpu", weights_only=True)  # noqa: E731
                yield factors_from_object(load, f"{path} (layer group {g})")


def scoring_groups(
    path: str | Path, settings: InfluenceSettings, expected_key: dict | None = None
) -> Iterator[tuple[InfluenceFactors, InfluenceSettings]]:
    """Each group's factors of ``path`` (:func:`factor_groups`) with ``settings`` tracking its
    layers (``settings`` as they are for factors in one group)."""
    grouped = group_names(path) is not None
    for factors in factor_groups(path, expected_key):
        yield factors, group_settings(settings, list(factors.layers)) if grouped else settings


def merged_groups(groups: Iterable[InfluenceFactors]) -> InfluenceFactors:
    """One :class:`InfluenceFactors` of every group's layers (all held: for small models and checks);
    the samples left out of any group are left out."""
    parts = list(groups)
    out = dataclasses.replace(parts[0], layers=dict(parts[0].layers))
    for part in parts[1:]:
        out.layers.update(part.layers)
        out.skipped = np.union1d(out.skipped, part.skipped)
        out.underflow = np.union1d(out.underflow, part.underflow)
        out.n_samples = min(out.n_samples, part.n_samples)
    return out
