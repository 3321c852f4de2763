"""Models: the built-in architectures, class-incremental logit restriction, and layer specs.

* :mod:`.networks`  ``small_cnn`` and ``resnet18_lop``, :func:`build_model`, :func:`restrict_logits`,
  :func:`positions_in`;
* :mod:`.layers`    layer specs shared by every stage (:func:`resolve_layers`) and
  :func:`check_finite_weights`;
* :mod:`.catalog`   the built-in models' module names without torch (config checks);
* :mod:`.hf`        Hugging Face transformers from local folders (:func:`build_hf_model`,
  :func:`load_hf_model`) and tiny ones for the demo and tests;
* :mod:`.hf_catalog` blocks, attention heads and MLPs of each transformer family, without torch.

The names below are imported on first use (PEP 562): importing the package loads no torch.
"""

from epochlens._lazy import attach

_EXPORTS = {
    "MODELS": "networks",
    "SmallCNN": "networks",
    "ResNet18LoP": "networks",
    "build_model": "networks",
    "restrict_logits": "networks",
    "positions_in": "networks",
    "default_layers": "layers",
    "available_layers": "layers",
    "resolve_layers": "layers",
    "check_finite_weights": "layers",
    "known_layers": "catalog",
    "build_hf_model": "hf",
    "load_hf_model": "hf",
    "HFLayout": "hf_catalog",
    "layout_from_config": "hf_catalog",
    "layout_of": "hf_catalog",
}
__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
