"""Benchmark: the sample explorer at the lop study's shape (50,000 samples x 21 checkpoints) and at
1,000,000 samples, in headless chromium (Debian's package; software rendering, no GPU).

For each size (``--sizes``), from a synthetic run's cached results (benchmarks/_synthetic_run.py:
random numbers shaped like a 10-class run's, ``--queries`` EK-FAC influence queries), written first
and not timed:

* ``dossier``: seconds of :func:`epochlens.samples.dossier_file.write_dossier`
  (what rule sample_dossier does) and the parquet's size (best of ``--build-repeats``; the machine's
  load average after them is reported, as timings on a shared machine depend on it);
* ``explorer``: seconds of :func:`epochlens.explorer.build.build_explorer` and the folder's size;
* ``page``: served on 127.0.0.1 by ``epochlens explore``'s server, the seconds from ``page.goto``
  to the scatter drawn (the canvas's ``data-drawn``), and from a click on a sample to its panel
  filled (series and neighbours); best of ``--repeats`` fresh pages, the sizes interleaved
  (50k, 1M, 50k, 1M, ...). Also whether this chromium has WebGL and its renderer.

    nice -n 5 .venv/bin/python benchmarks/explorer.py --sizes 50000 1000000 --epochs 21

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic_run import write_synthetic_run  # noqa: E402

from epochlens.explorer.build import build_explorer  # noqa: E402
from epochlens.explorer.serve import address, make_server  # noqa: E402
from epochlens.samples.dossier_file import write_dossier  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build(root: Path, n: int, epochs: int, queries: int, repeats: int) -> dict:
    """The dossier of a synthetic run's cached results, as rule sample_dossier builds it, then its
    explorer, as rule sample_explorer builds it: seconds (best of ``repeats``) and sizes."""
    inputs = write_synthetic_run(root / f"n{n}/cache", n, epochs, queries)
    dossier = root / f"n{n}/samples/dossier.parquet"
    out = dossier.parent / "explorer"
    dossier_s = explorer_s = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        write_dossier(inputs, dossier)
        dossier_s = min(dossier_s, time.perf_counter() - t)
        t = time.perf_counter()
        manifest = build_explorer(dossier, out)
        explorer_s = min(explorer_s, time.perf_counter() - t)
    return {
        "samples": n,
        "epochs": epochs,
        "queries": queries,
        "rows": manifest["n_rows"],
        "dossier": {"build_s": round(dossier_s, 2), "mb": round(dossier.stat().st_size / 1e6, 1)},
        "explorer": {"build_s": round(explorer_s, 2), "mb": round(folder_size(out) / 1e6, 1)},
        "load_average": [round(v, 1) for v in os.getloadavg()],
        "folder": str(out),
    }


def open_and_click(browser, url: str) -> dict:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    t0 = time.perf_counter()
    page.goto(url)
    page.wait_for_function("document.getElementById('scatter').dataset.drawn", timeout=120_000)
    drawn = time.perf_counter() - t0
    in_page = page.evaluate("window.explorerTimings.drawn") / 1000
    page.wait_for_selector("body[data-ready='1']", timeout=120_000)
    # a drawn, selected sample: the first training row's pixel
    x, y = page.evaluate(
        "(async () => { const xs = await column(app.state.x), ys = await column(app.state.y);"
        " let r = 0; while (!(app.mask[r] && Number.isFinite(xs[r]) && Number.isFinite(ys[r]))) r++;"
        " return toPixel(xs[r], ys[r]); })()"
    )
    box = page.locator("#scatter").bounding_box()
    t1 = time.perf_counter()
    page.mouse.click(box["x"] + x, box["y"] + y)
    page.wait_for_selector("#panel[data-row] canvas[data-series]", timeout=120_000)
    panel = time.perf_counter() - t1
    page.close()
    if errors:
        raise RuntimeError(f"console errors on {url}: {errors}")
    return {"open_to_scatter_s": drawn, "in_page_drawn_s": in_page, "click_to_panel_s": panel}


def webgl(browser) -> dict:
    page = browser.new_page()
    info = page.evaluate(
        "(() => { const gl = document.createElement('canvas').getContext('webgl');"
        " if (!gl) return {webgl: false};"
        " const d = gl.getExtension('WEBGL_debug_renderer_info');"
        " return {webgl: true, renderer: gl.getParameter(d ? d.UNMASKED_RENDERER_WEBGL : gl.RENDERER)}; })()"
    )
    page.close()
    return info


def measure(folders: dict, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    servers = {n: make_server(f, 0) for n, f in folders.items()}
    for s in servers.values():
        threading.Thread(target=s.serve_forever, daemon=True).start()
    best: dict = {n: {} for n in folders}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            gl = webgl(browser)
            for _ in range(repeats):
                for n, s in servers.items():  # the sizes interleaved
                    for k, v in open_and_click(browser, address(s)).items():
                        best[n][k] = round(min(best[n].get(k, float("inf")), v), 3)
            browser.close()
    finally:
        for s in servers.values():
            s.shutdown()
            s.server_close()
    return {"browser": gl, "pages": best}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[50_000, 1_000_000])
    p.add_argument("--epochs", type=int, default=21)
    p.add_argument("--queries", type=int, default=100, help="influence queries of the synthetic run")
    p.add_argument("--repeats", type=int, default=3, help="page timings: the best of this many fresh pages")
    p.add_argument("--build-repeats", type=int, default=1, help="build timings: the best of this many builds")
    p.add_argument("--keep", help="build into this folder and keep it (default: a temporary one)")
    args = p.parse_args(argv)
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing: install Debian's package chromium (apt-get install chromium)")
    root = Path(args.keep or tempfile.mkdtemp(prefix="explorer-bench-"))
    try:
        builds = [build(root, n, args.epochs, args.queries, args.build_repeats) for n in args.sizes]
        pages = measure({b["samples"]: Path(b["folder"]) for b in builds}, args.repeats)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    for b in builds:
        b["page"] = pages["pages"][b["samples"]]
        del b["folder"]
    machine = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()}
    report = {"machine": machine, "browser": pages["browser"], "sizes": builds}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
