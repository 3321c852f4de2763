"""A user's project, built in a temporary folder for the tests: a run epochlens did not train.

:func:`build_user_project` writes, under ``root``::

    code/tinyvit/{__init__,layers,model}.py   the user's ViT-like model (copied from template/),
                                              factory "tinyvit.model:build"
    data/shapes/{train,test}/<class>/NNN.png  16x16 RGB synthetic shapes as an ImageFolder
    data/shapes_hf/                           the same images as a save_to_disk DatasetDict
                                              (image, label: ClassLabel, source: clean/noisy)
    runs/loop/ckpt_{step}.pt                  {"model", "optimizer", "step"} from a plain loop
    runs/trainer/checkpoint-{step}/           a transformers.Trainer output folder

The model is trained here, outside epochlens, with the user's own preprocessing (Pillow resize to
8x8, x / 255, mean 0.5, std 0.25), and every saved state is kept in memory so the tests can check
what epochlens reads back against what was written.
"""

from userproject.build import CLASSES, UserProject, build_user_project

__all__ = ["CLASSES", "UserProject", "build_user_project"]
