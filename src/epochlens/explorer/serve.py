"""``epochlens explore RUN``: the run's explorer folder served on 127.0.0.1 (the standard library's
HTTP server: the page is static files), built first from the dossier when it is missing."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path

from epochlens.errors import DataError
from epochlens.layout import Layout

#: The port tried first: a link to a view keeps working across sessions while it is free.
DEFAULT_PORT = 8765


def explorer_folder(run: str, results: str | Path = "results", build: bool = True) -> Path:
    """The explorer folder of ``run`` (a run's name under ``results``, or a run's, a samples' or
    an explorer's folder), built from the run's dossier when it is missing and ``build``."""
    given = Path(run)
    candidates = [given, given / "explorer", given / "samples/explorer"]
    for folder in candidates:
        if (folder / "manifest.json").is_file():
            return folder
    layout = Layout(results)
    folder = Path(layout.explorer(run))
    dossier = folder.parent / "dossier.parquet"  # the contract's name (epochlens.samples.dossier)
    if given.is_dir():
        folder, dossier = given / "samples/explorer", given / "samples/dossier.parquet"
    if (folder / "manifest.json").is_file():
        return folder
    if build and dossier.is_file():
        from epochlens.explorer.build import build_explorer

        print(f"building {folder} from {dossier} ...", flush=True)
        build_explorer(dossier, folder)
        return folder
    raise DataError(
        f"no explorer for {run!r}: neither {folder}/manifest.json nor {dossier} exists. Build it with "
        f"`snakemake {folder}/index.html` in the run's working directory (or pass --results, or the "
        "folder itself)"
    )


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the standard library's name)
        pass


def make_server(folder: str | Path, port: int = DEFAULT_PORT) -> http.server.ThreadingHTTPServer:
    """A server of ``folder`` on 127.0.0.1:``port`` (the next free port when it is taken; 0: any)."""
    handler = functools.partial(_Quiet, directory=str(folder))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        if port == 0:
            raise
        return http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)


def address(server: http.server.ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"
