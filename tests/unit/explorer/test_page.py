"""The explorer page on the tiny dossier in headless chromium (tests/explorer_browser.py; skipped
without chromium or playwright): no console error, the detectors' AUROC as scikit-learn computes it
from the parquet, a sample's series and forgetting events, a neighbour's link, the view in the URL."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from explorer_browser import browser_page, chromium_path, open_view, served
from sklearn.metrics import roc_auc_score
from tiny_dossier import write_tiny_dossier

from epochlens.explorer.build import build_explorer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    chromium_path()
    root = tmp_path_factory.mktemp("tiny")
    dossier = write_tiny_dossier(root / "dossier.parquet")
    build_explorer(dossier, root / "explorer")
    return root / "explorer", pd.read_parquet(dossier)


def test_page_against_the_dossier(tiny):
    folder, dossier = tiny
    train = dossier[(dossier["role"] == "train") & (dossier["split"] == "train")]
    truth = train["is_corrupted"].astype(bool)
    with served(folder) as url, browser_page() as (page, errors):
        open_view(page, url)
        assert page.get_attribute("#count", "data-count") == "3"  # the training rows by default
        auroc = float(page.get_attribute(".roc-item[data-detector='loss_score']", "data-auroc"))
        assert auroc == pytest.approx(roc_auc_score(truth, train["loss_score"]), abs=1e-12)
        page.locator("#table tbody tr", has_text="cf bad film").click()
        page.wait_for_selector("#panel table.series-values[data-series='loss']", state="attached")
        cells = page.locator(
            "#panel table.series-values[data-series='loss'] td:nth-child(2)"
        ).all_text_contents()
        assert cells == ["2", "", "3"]
        assert "1 forgetting event(s)" in page.inner_text("#panel")  # correct, wrong, correct
        link = page.locator("#panel .neighbours a").first
        assert link.get_attribute("data-row") == "2"  # query 0 of index 0: the dossier's row 2
        link.click()
        page.wait_for_selector("#panel[data-row='2']")
        assert page.inner_text("#panel .sample-text") == "query one"
        assert "sample=0%3Aquery%3A0" in page.url
        other = page.context.new_page()
        open_view(other, page.url)
        other.wait_for_selector("#panel[data-row='2']")
        np.testing.assert_equal(other.inner_text("#panel .sample-text"), "query one")
        assert errors == [], errors
