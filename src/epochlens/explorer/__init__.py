"""The sample explorer: a static page over a run's dossier (``results/{run}/samples/dossier.parquet``).

``build`` turns the dossier into what the page loads (:mod:`epochlens.explorer.columns` classifies and
encodes its columns, :mod:`epochlens.explorer.roc` the detectors' ROC curves), ``serve`` serves the
folder on 127.0.0.1 (``epochlens explore RUN``); the page itself is ``static/`` (package data).
"""
