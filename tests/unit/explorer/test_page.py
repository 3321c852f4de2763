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


def test_a_samples_thumbnail_is_its_crop_of_the_sheet(tmp_path):
    """An image dossier: the panel's canvas shows the pixels of the sheet's box that ``image`` names."""
    import pyarrow as pa
    from PIL import Image

    chromium_path()
    sheet = np.random.default_rng(0).integers(0, 256, (8, 24, 3), dtype=np.uint8)
    (tmp_path / "thumbs").mkdir()
    Image.fromarray(sheet).save(tmp_path / "thumbs/train_0.png")
    rows = {
        "index": pa.array([0, 0], pa.int32()),
        "role": ["train", "train"],
        "position": pa.array([0, 1], pa.int64()),
        "id": ["train:0", "train:1"],
        "image": ["thumbs/train_0.png#xywh=0,0,8,8", "thumbs/train_0.png#xywh=8,0,8,8"],
        "confidence": [0.5, 0.75],
    }
    build_explorer(write_tiny_dossier(tmp_path / "dossier.parquet", rows=rows), tmp_path / "explorer")
    with served(tmp_path / "explorer") as url, browser_page() as (page, errors):
        open_view(page, url)
        page.locator("#table tbody tr", has_text="train:1").click()
        page.wait_for_selector("#panel canvas.thumb[data-drawn='true']")
        shown = page.evaluate(
            "() => Array.from(document.querySelector('#panel canvas.thumb').getContext('2d')"
            ".getImageData(0, 0, 8, 8).data)"
        )
        assert page.get_attribute("#panel canvas.thumb", "aria-label") == "train:1"
        assert errors == [], errors
    np.testing.assert_array_equal(np.asarray(shown).reshape(8, 8, 4)[..., :3], sheet[:, 8:16])
