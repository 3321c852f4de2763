# Helpers of rules/explorer.smk: the page's files and the targets.

#: The page's files (package data): editing one rebuilds every explorer.
EXPLORER_ASSETS = sorted(
    str(p) for p in (PACKAGE_DIR / "explorer" / "static").glob("*")
)


def explorer_targets():
    """Each dossier's explorer (rules/samples.smk: the runs that get a dossier)."""
    return [f"{layout.explorer(run)}/index.html" for run in dossier_runs()]


def get_explorer_thumbnails(wildcards):
    """The run's thumbnails folder, which the explorer copies, where the run has one (image runs:
    rules/samples.smk's sample_targets)."""
    if dossier_kind(wildcards.run) in ("classification", "regression"):
        return [layout.thumbnails(wildcards.run)]
    return []
