"""The text run of benchmarks/scale.py (``--source text``): config/examples/text_classifier.yaml
pointed at a project in the user's formats: N polarity sentences in ``train.jsonl`` and
``test.jsonl`` (a group column), the polarity word tokenizer saved with ``save_pretrained``, and
one randomly initialised BERT of the demo's size (2 blocks of width 64) saved as a Trainer
checkpoint folder (``config.json`` + ``model.safetensors``). ``--stages samples``: the evaluation,
sample outputs, dossier, data map and explorer; ``all``: curvature, features, probes, ablations and
influence as well."""

from __future__ import annotations

from pathlib import Path

import _common
import torch
import yaml

from epochlens.data.polarity import polarity_tables, write_polarity_tokenizer

TEXT_RUN, STEP = "sst", 200
ON = {"enabled": True}


def write_text_project(work: Path, n_train: int, stages: str, n_test: int = 10_000) -> Path:
    """The project's files under ``work`` and its config; returns the config file."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    data = work / "data" / "sst"
    data.mkdir(parents=True, exist_ok=True)
    for split, table in polarity_tables(n_train, n_test, seed=0).items():
        sentences = table.rename(columns={"text": "sentence"})
        sentences.to_json(data / f"{split}.jsonl", orient="records", lines=True)
    tokenizer = write_polarity_tokenizer(work / "runs" / "sst" / "tokenizer")
    words = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    config = BertConfig(vocab_size=len(words), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2,
                        pad_token_id=words.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(work / "runs" / "sst" / f"checkpoint-{STEP}")
    cfg = yaml.safe_load((_common.REPO / "config" / "examples" / "text_classifier.yaml").read_text())
    run = cfg["runs"][TEXT_RUN]
    run["data"]["path"] = str(data)
    run["data"]["text"]["tokenizer"] = str(tokenizer)
    run["data"].pop("ground_truth")  # no poisons in these sentences
    run["checkpoints"]["path"] = str(work / "runs" / "sst" / "checkpoint-{epoch}")
    run["checkpoints"]["steps_per_epoch"] = STEP  # no trainer_state.json: the step is epoch 1
    if stages == "all":
        run.update(curvature=ON, features=ON, probes=ON, ablation=ON)
    else:
        run["influence"] = {"enabled": False}
    cfg["device"] = "cpu"
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return work / "config.yaml"
