# Helpers of rules/explorer.smk: the page's files and the targets.

#: The page's files (package data): editing one rebuilds every explorer.
EXPLORER_ASSETS = sorted(
    str(p) for p in (PACKAGE_DIR / "explorer" / "static").glob("*")
)


def explorer_targets():
    """Each dossier's explorer (rules/samples.smk: the runs that get a dossier)."""
    return [f"{layout.explorer(run)}/index.html" for run in dossier_runs()]
