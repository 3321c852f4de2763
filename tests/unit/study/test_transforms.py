"""Query transforms of the poison study (epochlens.study.transforms): images and texts."""

from __future__ import annotations

import pytest
import torch

from epochlens.errors import ConfigError
from epochlens.study.transforms import transform_queries

PAD = 0


def test_query_transforms() -> None:
    x = torch.randn(4, 2, 5, 5)
    torch.testing.assert_close(transform_queries(transform_queries(x, "hflip"), "hflip"), x)
    assert torch.equal(transform_queries(x, "hflip")[..., 0], x[..., -1])
    n1, n2 = (
        transform_queries(x, "noise", seed=1, noise_std=0.5),
        transform_queries(x, "noise", seed=1, noise_std=0.5),
    )
    assert torch.equal(n1, n2) and not torch.equal(n1, transform_queries(x, "noise", seed=2, noise_std=0.5))
    assert 0.3 < float((n1 - x).std()) < 0.7
    c = transform_queries(x, "crop", seed=0, pad=1)
    assert c.shape == x.shape and torch.equal(c, transform_queries(x, "crop", seed=0, pad=1))
    for i in range(4):  # each image is its own copy, shifted by at most one pixel with zeros entering
        padded = torch.nn.functional.pad(x[i], (1, 1, 1, 1))
        assert any(
            torch.equal(c[i], padded[:, dy : dy + 5, dx : dx + 5]) for dy in range(3) for dx in range(3)
        )
    assert torch.equal(transform_queries(x, "none"), x)
    with pytest.raises(ConfigError, match="query transform 'rotate'"):
        transform_queries(x, "rotate")


def texts(left: bool = False) -> dict[str, torch.Tensor]:
    """Three queries of 7, 3 and 2 real tokens (ids 10.., 20.., 30..) padded to 9 with PAD."""
    rows = [list(range(10, 17)), [20, 21, 22], [30, 31]]
    ids = torch.full((3, 9), PAD)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for i, row in enumerate(rows):
        where = slice(9 - len(row), None) if left else slice(0, len(row))
        ids[i, where], mask[i, where] = torch.tensor(row), 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(3, 9, dtype=torch.long)}


def real_tokens(out: dict, q: int) -> list[int]:
    return out["input_ids"][q][out["attention_mask"][q].bool()].tolist()


@pytest.mark.parametrize("left", [False, True])
def test_token_dropout_deletes_inner_tokens_and_closes_up(left) -> None:
    x = texts(left)
    out = transform_queries(x, "token_dropout", seed=3, drop_fraction=0.5, pad_token_id=PAD)
    again = transform_queries(x, "token_dropout", seed=3, drop_fraction=0.5, pad_token_id=PAD)
    assert all(torch.equal(out[k], again[k]) for k in out)  # seeded
    other = transform_queries(x, "token_dropout", seed=4, drop_fraction=0.5, pad_token_id=PAD)
    assert not torch.equal(out["input_ids"], other["input_ids"])
    first = real_tokens(out, 0)
    assert first[0] == 10 and first[-1] == 16 and len(first) < 7  # the ends stay, some inner go
    assert first == sorted(first) and set(first) <= set(range(10, 17))  # in order, nothing new
    assert real_tokens(out, 2) == [30, 31]  # no inner token: unchanged
    for q in range(3):  # padding: PAD ids on the side the query was padded, the tokens contiguous
        mask = out["attention_mask"][q]
        n = int(mask.sum())
        expected = torch.zeros(9, dtype=torch.long)
        expected[slice(9 - n, None) if left else slice(0, n)] = 1
        assert torch.equal(mask, expected)
        assert (out["input_ids"][q][mask == 0] == PAD).all()
    assert torch.equal(out["token_type_ids"], x["token_type_ids"])
    # a query's draws are its own: the same query alone is transformed the same way
    alone = transform_queries({k: v[:1] for k, v in x.items()}, "token_dropout", seed=3, drop_fraction=0.5)
    assert real_tokens(alone, 0) == first
    unchanged = transform_queries(x, "token_dropout", drop_fraction=0.0, pad_token_id=PAD)
    assert all(torch.equal(unchanged[k], x[k]) for k in x)


@pytest.mark.parametrize("left", [False, True])
def test_truncate_keeps_the_start_and_the_last_token(left) -> None:
    x = texts(left)
    out = transform_queries(x, "truncate", keep_fraction=0.5, pad_token_id=PAD)
    assert real_tokens(out, 0) == [10, 11, 12, 13, 16]  # first, ceil(0.5 x 5) inner, last
    assert real_tokens(out, 1) == [20, 21, 22]  # ceil(0.5 x 1) = 1 inner token
    whole = transform_queries(x, "truncate", keep_fraction=1.0, pad_token_id=PAD)
    assert all(torch.equal(whole[k], x[k]) for k in x)


def test_image_and_text_transforms_refuse_the_other_kind() -> None:
    with pytest.raises(ConfigError, match="'hflip' transforms images; a text run takes"):
        transform_queries(texts(), "hflip")
    with pytest.raises(ConfigError, match="'truncate' transforms texts; an image run takes"):
        transform_queries(torch.zeros(2, 1, 3, 3), "truncate")
    with pytest.raises(ConfigError, match="drop_fraction=1.0"):
        transform_queries(texts(), "token_dropout", drop_fraction=1.0)
