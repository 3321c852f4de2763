"""The results layout: every path under ``results/`` is spelled here, once (torch-free).

::

    results/{run}/
      data/dataset.h5, data/corrupted_indices.npy, data/training_data.npz
      index-{index}/
        class_order.npy, train_log.csv, train_metadata.json
        sample_outputs.npz                        what each checkpoint predicts for every sample
        sample_outputs/shard_{k}-of-{S}.npz       its shards (samples.shards jobs)
        checkpoints/epoch_{E}.pt                  when the pipeline trains (or runs your command)
        train_output/                             what your training command wrote besides them
        .resume/train/, .resume/output/           resume state of a training job (not outputs)
        checkpoints/epoch_{E}.missing             never written: a missing checkpoint's failing job
        eval/epoch_{E}.csv
        curvature/epoch_{E}/per_image_{key}.npy, metadata.json, shards/shard_{k}-of-{S}.npz
        features/epoch_{E}.h5, probes/epoch_{E}.csv, ablation/epoch_{E}.csv
        features/epoch_{E}/{representation}.h5, probes/epoch_{E}/{representation}.csv
                                                  a run of stored activations: one per representation
        activations/epoch_{E}/{split}/{layer}.npy  its parquet snapshot, decoded once for them all
        influence/epoch_{E}/{method}/factors.pt, factor_diagnostics.csv, scores.npz, ...,
          shards/{covariances,corrections}_{k}-of-{S}.pt, shards/scores_{k}-of-{S}.npz
        influence/epoch_{E}/lds/retrain_{k}-of-{P}.npz
      samples/dossier.parquet                     every per-sample result of the run, one table
      samples/thumbs/{split}_{sheet}.png          thumbnails of the images, packed in sheets (image runs)
      samples/explorer/                           the sample explorer (index.html, manifest.json, ...)
      tables/{name}.csv, tables/{name}.provenance.json
      figures/{name}.png and .pdf
      logs/{stage}[/index-{index}][/epoch_{E}][/{name}].log, benchmarks/... .tsv

Every argument is a value or a Snakemake wildcard string such as ``"{epoch}"`` (the default of
each argument is its wildcard, so rules write ``layout.eval_table()``). Epochs are formatted
``epoch_{:04d}`` here and nowhere else; an epoch given as digits ("0040", the value of the
``{epoch}`` wildcard) is the same epoch as 40. These are the paths users already have on disk:
changing one orphans their results.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIGURE_FORMATS = ("png", "pdf")
#: A path component: a value (an epoch as int or digits) or a wildcard string such as "{epoch}".
Val = int | str


def _is_wildcard(value: object) -> bool:
    return isinstance(value, str) and value.startswith("{") and value.endswith("}")


def epoch_name(epoch: Val) -> str:
    """``epoch_0040`` for 40 or "0040"; ``epoch_{epoch}`` for the wildcard "{epoch}"."""
    if _is_wildcard(epoch):
        return f"epoch_{epoch}"
    return f"epoch_{int(epoch):04d}"


def index_name(index: Val) -> str:
    """``index-0`` for 0 or "0"; ``index-{index}`` for the wildcard."""
    return f"index-{index}" if _is_wildcard(index) else f"index-{int(index)}"


def shard_name(shard: Val = "{shard}", nshards: Val = "{nshards}") -> str:
    """``shard_{k}-of-{S}``: shard k of S of one epoch's curvature or of an index's sample outputs."""
    return f"shard_{shard}-of-{nshards}"


def representation_file(name: str) -> str:
    """A representation's name as a file name: a user function ``package.module:function`` as
    ``package.module-function`` (``-`` is in no Python name, so the name comes back unchanged by
    :func:`representation_name`); a built-in as itself; a wildcard stays a wildcard."""
    return name if _is_wildcard(name) else name.replace(":", "-")


def representation_name(file_name: str) -> str:
    """The representation whose file name is ``file_name`` (:func:`representation_file`)."""
    return file_name.replace("-", ":", 1)


@dataclass(frozen=True)
class Layout:
    """Paths under ``root`` (``results`` relative to the working directory by default)."""

    root: str | Path = "results"

    # -- per run -------------------------------------------------------------------------------
    def run_dir(self, run: str = "{run}") -> str:
        return f"{self.root}/{run}"

    def dataset(self, run: str = "{run}") -> str:
        """The run's data set (train/test images, labels, holdout, normalisation)."""
        return f"{self.run_dir(run)}/data/dataset.h5"

    def training_data(self, run: str = "{run}") -> str:
        """The run's data set as the ``{data}`` of a training command (``.npz``,
        :mod:`epochlens.data.export`)."""
        return f"{self.run_dir(run)}/data/training_data.npz"

    def corrupted_indices(self, run: str = "{run}") -> str:
        """Training positions corrupted on purpose (data.corruption), int64 .npy."""
        return f"{self.run_dir(run)}/data/corrupted_indices.npy"

    def table(self, name: str, run: str = "{run}") -> str:
        """A run-level table ``tables/{name}.csv``."""
        return f"{self.run_dir(run)}/tables/{name}.csv"

    def table_provenance(self, name: str, run: str = "{run}") -> str:
        """The provenance of the tables of rule ``name`` (``tables/{name}.provenance.json``)."""
        return f"{self.run_dir(run)}/tables/{name}.provenance.json"

    def dossier(self, run: str = "{run}") -> str:
        """Every per-sample result of the run in one table (:mod:`epochlens.samples`)."""
        return f"{self.run_dir(run)}/samples/dossier.parquet"

    def thumbnails(self, run: str = "{run}") -> str:
        """The folder of every image's thumbnail PNG, beside the dossier (image runs)."""
        return f"{self.run_dir(run)}/samples/thumbs"

    def figure(self, name: str, ext: str, run: str = "{run}") -> str:
        """One format of a figure: ``figures/{name}.{ext}``."""
        return f"{self.run_dir(run)}/figures/{name}.{ext}"

    def figures(self, name: str, run: str = "{run}") -> list[str]:
        """A figure as its PNG and PDF pair."""
        return [self.figure(name, ext, run) for ext in FIGURE_FORMATS]

    def explorer(self, run: str = "{run}") -> str:
        """The sample explorer's folder (static page, epochlens.explorer), built from the dossier."""
        return f"{self.run_dir(run)}/samples/explorer"

    def log(self, stage: str, run: str = "{run}", index=None, epoch=None, name=None) -> str:
        """``logs/{stage}[/index-{index}][/epoch_{E}][/{name}].log``."""
        return f"{self.run_dir(run)}/logs/{self._job(stage, index, epoch, name)}.log"

    def benchmark(
        self, stage: str, run: str = "{run}", index=None, epoch=None, name: str | None = None
    ) -> str:
        """``benchmarks/...tsv``, named as the job's log."""
        return f"{self.run_dir(run)}/benchmarks/{self._job(stage, index, epoch, name)}.tsv"

    @staticmethod
    def _job(stage: str, index, epoch, name: str | None) -> str:
        parts = [stage]
        if index is not None:
            parts.append(index_name(index))
        if epoch is not None:
            parts.append(epoch_name(epoch))
        if name is not None:
            parts.append(name)
        return "/".join(parts)

    # -- per replicate index -------------------------------------------------------------------
    def index_dir(self, run: str = "{run}", index: Val = "{index}") -> str:
        return f"{self.run_dir(run)}/{index_name(index)}"

    def resume_dir(self, run: str = "{run}", index: Val = "{index}") -> str:
        """Where a training job keeps its resume state (not an output: Snakemake does not delete it
        when the job fails; removed when the job completes)."""
        return f"{self.index_dir(run, index)}/.resume/train"

    def command_output(self, run: str = "{run}", index: Val = "{index}") -> str:
        """The ``{output}`` folder of a training command's job: what it writes, kept across attempts
        with its ``{resume}`` folder (:meth:`resume_dir`) until the job completes."""
        return f"{self.index_dir(run, index)}/.resume/output"

    def command_state(self, run: str = "{run}", index: Val = "{index}") -> str:
        """What the kept ``{output}`` and ``{resume}`` folders were made for (command, files, data)."""
        return f"{self.index_dir(run, index)}/.resume/command.json"

    def command_subset(self, run: str = "{run}", index: Val = "{index}") -> str:
        """The ``{subset}`` of a training command's job: every non-holdout position of ``{data}``'s
        x_train (int64 ``.npy``), beside its kept folders."""
        return f"{self.index_dir(run, index)}/.resume/subset.npy"

    def train_output(self, run: str = "{run}", index: Val = "{index}") -> str:
        """What a training command wrote into ``{output}`` besides its checkpoints (metrics, logs)."""
        return f"{self.index_dir(run, index)}/train_output"

    def class_order(self, run: str = "{run}", index: Val = "{index}") -> str:
        """int64 permutation of the classes (position p: the class introduced p-th)."""
        return f"{self.index_dir(run, index)}/class_order.npy"

    def sample_outputs(self, run: str = "{run}", index: Val = "{index}") -> str:
        """What every analysed checkpoint predicts for every training and test sample (loss,
        probability of the label, margin, correctness; :mod:`epochlens.samples.outputs`)."""
        return f"{self.index_dir(run, index)}/sample_outputs.npz"

    def sample_outputs_shard(
        self, run: str = "{run}", index: Val = "{index}", shard: Val = "{shard}", nshards: Val = "{nshards}"
    ) -> str:
        """One shard (a contiguous range of each split's samples) of the sample outputs."""
        return f"{self.index_dir(run, index)}/sample_outputs/{shard_name(shard, nshards)}.npz"

    def train_log(self, run: str = "{run}", index: Val = "{index}") -> str:
        return f"{self.index_dir(run, index)}/train_log.csv"

    def train_metadata(self, run: str = "{run}", index: Val = "{index}") -> str:
        return f"{self.index_dir(run, index)}/train_metadata.json"

    # -- per checkpoint ------------------------------------------------------------------------
    def _epoch_file(self, folder: str, ext: str, run, index, epoch) -> str:
        return f"{self.index_dir(run, index)}/{folder}/{epoch_name(epoch)}.{ext}"

    def _representation_file(self, folder: str, ext: str, run, index, epoch, representation) -> str:
        name = representation_file(representation)
        return f"{self.index_dir(run, index)}/{folder}/{epoch_name(epoch)}/{name}.{ext}"

    def checkpoint(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        """A checkpoint the pipeline trained (a bare state_dict)."""
        return self._epoch_file("checkpoints", "pt", run, index, epoch)

    def missing_checkpoint(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        """Stands for a checkpoint missing from the user's folder: the output of a job that fails
        with the fix (never written; see epochlens.config.inputs)."""
        return self._epoch_file("checkpoints", "missing", run, index, epoch)

    def eval_table(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        """Per-class accuracy of one checkpoint."""
        return self._epoch_file("eval", "csv", run, index, epoch)

    def features(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        """Per-layer features of one checkpoint (HDF5 with its cache key)."""
        return self._epoch_file("features", "h5", run, index, epoch)

    def probe_table(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        return self._epoch_file("probes", "csv", run, index, epoch)

    def stored_features(
        self,
        run: str = "{run}",
        index: Val = "{index}",
        epoch: Val = "{epoch}",
        representation: str = "{representation}",
    ) -> str:
        """A run of stored activations: one representation's features of one snapshot (the
        :meth:`features` file format, that representation only), so that each is rebuilt alone."""
        return self._representation_file("features", "h5", run, index, epoch, representation)

    def decoded_activations(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        """A run of stored activations: its parquet snapshot decoded once into ``.npy`` layers
        (:mod:`epochlens.features.stored_decode`), a folder that every representation job reads."""
        return f"{self.index_dir(run, index)}/activations/{epoch_name(epoch)}"

    def stored_probe_table(
        self,
        run: str = "{run}",
        index: Val = "{index}",
        epoch: Val = "{epoch}",
        representation: str = "{representation}",
    ) -> str:
        """A run of stored activations: the probe table of one representation of one snapshot."""
        return self._representation_file("probes", "csv", run, index, epoch, representation)

    def ablation_table(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        return self._epoch_file("ablation", "csv", run, index, epoch)

    def curvature_dir(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        """The merged per-image curvature files of one checkpoint."""
        return f"{self.index_dir(run, index)}/curvature/{epoch_name(epoch)}"

    def curvature_array(
        self, key: str, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}"
    ) -> str:
        """``per_image_{key}.npy`` (key: curvature, directional_eig, loss, grad_norm, ...)."""
        return f"{self.curvature_dir(run, index, epoch)}/per_image_{key}.npy"

    def curvature_metadata(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        return f"{self.curvature_dir(run, index, epoch)}/metadata.json"

    def curvature_shard(
        self,
        run: str = "{run}",
        index: Val = "{index}",
        epoch: Val = "{epoch}",
        shard: Val = "{shard}",
        nshards: Val = "{nshards}",
    ) -> str:
        """One shard (a contiguous range of training samples) of an epoch's curvature."""
        return f"{self.curvature_dir(run, index, epoch)}/shards/{shard_name(shard, nshards)}.npz"

    def influence_dir(
        self,
        run: str = "{run}",
        index: Val = "{index}",
        epoch: Val = "{epoch}",
        method: str = "{method}",
    ) -> str:
        """Factors and scores of one influence method at one checkpoint."""
        return f"{self.index_dir(run, index)}/influence/{epoch_name(epoch)}/{method}"

    def influence_file(
        self,
        name: str,
        run: str = "{run}",
        index: Val = "{index}",
        epoch: Val = "{epoch}",
        method: str = "{method}",
    ) -> str:
        """``factors.pt``, ``factor_diagnostics.csv``, ``scores.npz``, ``metadata.json`` or
        ``diagnostics.csv`` of one influence method at one checkpoint (``eigenbasis.pt``: EK-FAC's
        eigendecomposed factors before their corrections, when the fit is sharded;
        ``curvature.pt``: a projected method's eigendecomposed curvature)."""
        return f"{self.influence_dir(run, index, epoch, method)}/{name}"

    def influence_shard(
        self,
        kind: str,
        run: str = "{run}",
        index: Val = "{index}",
        epoch: Val = "{epoch}",
        method: str = "{method}",
        shard: Val = "{shard}",
        nshards: Val = "{nshards}",
        ext: str | None = None,
    ) -> str:
        """One shard (a contiguous range of the training images) of an influence pass: ``kind``
        covariances or corrections (sums, ``.pt``), scores (``.npz``) or a projected method's
        gradient store (``store``: its rows, ``ext`` npy, and what they are, ``.pt``)."""
        ext = ext or ("npz" if kind == "scores" else "pt")
        return f"{self.influence_dir(run, index, epoch, method)}/shards/{kind}_{shard}-of-{nshards}.{ext}"

    def lds_dir(self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}") -> str:
        """The linear datamodeling score's retrainings of one analysed checkpoint."""
        return f"{self.index_dir(run, index)}/influence/{epoch_name(epoch)}/lds"

    def lds_retrain_dir(
        self, run: str = "{run}", index: Val = "{index}", epoch: Val = "{epoch}", subset: Val = "{subset}"
    ) -> str:
        """Where the training command retrains LDS subset k (a run with ``checkpoints.source:
        command``): its ``{subset}`` file, ``{output}`` and ``{resume}`` folders and, once
        measured, the measurement; kept across attempts of the job (not an output), removed when
        the job completes."""
        return f"{self.lds_dir(run, index, epoch)}/.retrain/subset-{subset}"

    def lds_part(
        self,
        run: str = "{run}",
        index: Val = "{index}",
        epoch: Val = "{epoch}",
        part: Val = "{part}",
        nparts: Val = "{nparts}",
    ) -> str:
        """Part k of P of the LDS retrainings: the query measurements after retraining on each of
        its subsets (``.npz``)."""
        return f"{self.lds_dir(run, index, epoch)}/retrain_{part}-of-{nparts}.npz"


#: The layout of a workflow run from its working directory.
RESULTS = Layout()
