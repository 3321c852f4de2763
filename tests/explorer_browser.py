"""The sample explorer in a real browser: Debian's chromium driven by Playwright (``executable_path``:
never ``playwright install``, which downloads a browser), the page served on 127.0.0.1 by
``epochlens explore``'s server. Skips, naming what to install, where chromium or playwright is
missing (``.ci/run`` installs chromium when it runs as root with apt).

:func:`check_polarity_explorer` is the test of the polarity demo's explorer (tests/workflow/
test_end_to_end.py calls it on the run it builds): no console error; the detectors' AUROCs are the
run's poison_detection table's; sorted by EK-FAC query
influence, the first rows are the dossier's, and its trigger sentences (flagged in the ground truth,
with the trigger word) among them; a sample's loss series as
the dossier holds it; a neighbour's link opens that sample; a link to the view reopens it; filters
and the exported CSV against pandas' filter of the parquet.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from epochlens.explorer.serve import address, make_server

CHROMIUM = "chromium"
TOP = 5


def chromium_path() -> str:
    """Debian's chromium, or a skip that names the package (and playwright, when it is missing); under
    CI=true a failure instead, so that CI never passes without the browser test (.ci/run installs it)."""
    missing = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
    if importlib.util.find_spec("playwright") is None:
        missing("playwright is not installed: pip install playwright (the dev extra)")
    path = shutil.which(CHROMIUM)
    if path is None:
        missing("chromium is not installed: apt-get install chromium (Debian's package)")
    return path


@contextlib.contextmanager
def served(folder: Path):
    server = make_server(folder, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield address(server)
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def browser_page():
    """A page of headless chromium that records every console error and uncaught exception."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            yield page, errors
        finally:
            browser.close()


def open_view(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)


def _table_texts(page) -> list[str]:
    return page.locator("#table tbody tr td.text").all_inner_texts()


def _sort_by(page, column: str) -> None:
    page.select_option("#sort", column)
    page.wait_for_selector(f"#table th[data-column='{column}']:has-text('▼')")


def _panel_series(page, name: str) -> np.ndarray:
    cells = page.locator(f"#panel table.series-values[data-series='{name}'] tr td:nth-child(2)")
    return np.array([float(t) if t else np.nan for t in cells.all_text_contents()])


def check_sort_and_panel(page, dossier: pd.DataFrame, column: str) -> pd.Series:
    """Sorted by ``column``: the first rows are the dossier's; the first one's loss series."""
    _sort_by(page, column)
    train = dossier[dossier["role"] == "train"].copy()
    train["key"] = train[column].astype(np.float32)
    expected = train.sort_values("key", ascending=False, kind="stable").head(TOP)
    assert _table_texts(page)[:TOP] == list(expected["text"]), (_table_texts(page)[:TOP], expected["text"])
    page.locator("#table tbody tr").first.click()
    page.wait_for_selector("#panel table.series-values[data-series='loss']", state="attached")
    first = expected.iloc[0]
    np.testing.assert_allclose(_panel_series(page, "loss"), np.asarray(first["loss"], float), rtol=1e-5)
    assert page.locator("#panel .sample-text").inner_text() == first["text"]
    return expected


def check_neighbour_link(page, dossier: pd.DataFrame) -> None:
    """The first neighbour's link opens that sample (its text in the panel)."""
    link = page.locator("#panel .neighbours a").first
    row = int(link.get_attribute("data-row"))
    link.click()
    page.wait_for_selector(f"#panel[data-row='{row}']")
    assert page.locator("#panel .sample-text").inner_text() == dossier.iloc[row]["text"]


def check_link_reopens(page, url: str) -> None:
    """The page's own address (view, filters, sample) opens the same view in a new page."""
    link = page.url
    text = page.locator("#panel .sample-text").inner_text()
    count = page.get_attribute("#count", "data-count")
    other = page.context.new_page()
    open_view(other, link)
    other.wait_for_selector("#panel .sample-text")
    assert other.locator("#panel .sample-text").inner_text() == text
    assert other.get_attribute("#count", "data-count") == count
    other.close()


def check_filter_and_export(page, dossier: pd.DataFrame, column: str, label: str, low: float) -> pd.DataFrame:
    """Filter (``column`` == ``label``, confidence >= ``low``, training rows), export the
    selection: the CSV is pandas' filter of the parquet."""
    page.select_option("#add-filter", column)
    box = page.locator(f".filter[data-column='{column}']")
    for other in box.locator("input[type=checkbox]").all():
        if other.get_attribute("value") != label:
            other.uncheck()
    page.select_option("#add-filter", "confidence")
    page.locator(".filter[data-column='confidence'] input.min").fill(str(low))
    page.locator(".filter[data-column='confidence'] input.min").dispatch_event("change")
    conf = dossier["confidence"].astype(np.float32)
    chosen = dossier[column].astype(str) == label
    expected = dossier[(dossier["role"] == "train") & chosen & (conf >= np.float32(low))]
    page.wait_for_selector(f"#count[data-count='{len(expected)}']")
    with page.expect_download() as download:
        page.click("#export")
    csv = pd.read_csv(io.StringIO(Path(download.value.path()).read_text()))
    key = ["index", "role", "position"]
    assert len(csv) == len(expected)
    got = csv.sort_values(key).reset_index(drop=True)
    want = expected.sort_values(key).reset_index(drop=True)
    assert (got[key].astype(str).values == want[key].astype(str).values).all()
    np.testing.assert_allclose(got["confidence"], want["confidence"], rtol=1e-6)
    assert (got[column].astype(str) == label).all()
    return csv


def check_trigger_rows(page, top: pd.DataFrame) -> None:
    """The first rows' ground truth as the page shows it is the dossier's, a row is flagged
    exactly when its sentence holds the trigger word "cf", and trigger sentences lead."""
    shown = page.locator("#table tbody tr td[data-column='is_corrupted']").all_text_contents()[:TOP]
    assert shown == ["true" if v else "false" for v in top["is_corrupted"]], shown
    assert [("cf" in t.split()) for t in top["text"]] == list(top["is_corrupted"].astype(bool)), top["text"]
    assert top["is_corrupted"].any(), top[["text", "is_corrupted"]]


def check_aurocs(page, detection: pd.DataFrame) -> None:
    """The page's AUROC of each detector is the run's poison_detection table's (same rows)."""
    auroc = detection.set_index(["method", "signal"])["auroc"]
    pairs = [(f"{m}_query_influence_score", (m, "query_influence")) for m in ("ekfac", "identity")]
    for name, key in [*pairs, ("loss_score", ("loss", "loss"))]:
        shown = float(page.get_attribute(f".roc-item[data-detector='{name}']", "data-auroc"))
        assert shown == pytest.approx(auroc[key], abs=1e-9), (name, shown, auroc[key])


def check_polarity_explorer(folder: Path, dossier_path: Path, detection_path: Path) -> None:
    dossier = pd.read_parquet(dossier_path)
    with served(folder) as url, browser_page() as (page, errors):
        open_view(page, url)
        check_aurocs(page, pd.read_csv(detection_path))
        top = check_sort_and_panel(page, dossier, "query_influence_ekfac")
        check_trigger_rows(page, top)
        check_neighbour_link(page, dossier)
        check_link_reopens(page, url)
        page.click("#reset")
        label = "label_name" if "label_name" in dossier else "label"
        check_filter_and_export(page, dossier, label, str(dossier[label].dropna().iloc[0]), 0.5)
        assert errors == [], errors
