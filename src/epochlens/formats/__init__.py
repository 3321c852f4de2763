"""Reading what a user brings: their own model, checkpoints and data.

Modules (import each directly; this package imports nothing, so the torch-free ones stay torch-free):

* :mod:`epochlens.formats.factory` (torch-free): ``model.factory: "package.module:function"`` specs,
  importing the factory from the user's project, and the project's source files it depends on
  (for rule inputs and provenance).
* :mod:`epochlens.formats.user_model` (torch): building the user's model, taking the logits out of
  whatever its forward returns, and the default blocks (residual blocks / encoder layers).
* :mod:`epochlens.formats.trainer_folders` (torch-free): Hugging Face Trainer output folders
  (``checkpoint-{step}/``), their weight files and the step -> epoch table.
* :mod:`epochlens.formats.weights` (torch): loading a state_dict from any supported checkpoint
  layout and fitting it to a model with a diagnosis of keys that do not fit.
* :mod:`epochlens.formats.images`: image data as ImageFolder trees (read by
  :mod:`epochlens.formats.image_folder`), ``datasets`` folders written by ``save_to_disk`` and
  parquet files, read into :class:`epochlens.data.Dataset`.
"""
