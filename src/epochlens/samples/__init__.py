"""Every per-sample result of a run in one table, the dossier (``samples/dossier.parquet``).

* :mod:`.outputs`    what a checkpoint predicts for every training and test sample (loss,
  probability of the label, margin, correctness; a regression's absolute error): the one model
  pass of this stage, in ``samples.shards`` jobs per replicate index;
* :mod:`.output_files` their shard files, merged into ``index-{i}/sample_outputs.npz``;
* :mod:`.summaries`  per-sample summaries over checkpoints: the data map's confidence,
  variability and correctness (Dataset Cartography), the area under the margin (AUM);
* :mod:`.identity`   who each row is: position, id, split, label, group, text, ground truth;
* :mod:`.neighbours` influence neighbours and self-influence per method (``scores.npz``);
* :mod:`.detectors`  every detector as a score and a flag (cleanlab's convention);
* :mod:`.thumbnails` a thumbnail PNG of every image, named by the dossier's ``image`` column;
* :mod:`.columns`    every column's arrow type and description (:mod:`.arrow_columns`: as arrays);
* :mod:`.dossier`    the table itself: columns assembled, checked and written as parquet.

Everything but :mod:`.outputs` reads cached results only and imports no torch.
"""
