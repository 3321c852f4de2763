"""Rule sample_explorer: the run's explorer folder (samples/explorer/: the static page, its manifest,
columns and chunks) from its dossier (epochlens.explorer.build).

By hand, from the run's working directory: python scripts/sample_explorer.py run=digits
"""

from pathlib import Path

from _helpers import run_script

from epochlens.explorer.build import build_explorer
from epochlens.runner import log


def main(snakemake) -> None:
    manifest = build_explorer(snakemake.input.dossier, Path(snakemake.output.manifest).parent)
    log.info("explorer of %d rows: %s", manifest["n_rows"], Path(snakemake.output.page).resolve())


if __name__ == "__main__":
    run_script(main, "sample_explorer", globals().get("snakemake"))
