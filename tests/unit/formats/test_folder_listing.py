"""A data folder's fingerprint (epochlens.formats.folder_listing): it changes when a file is
replaced (size or modification time), added, removed or renamed, in any subfolder; hidden files
are not data; a missing folder is named with the fix."""

from __future__ import annotations

import os

import pytest

from epochlens.errors import DataError
from epochlens.formats.folder_listing import folder_fingerprint


def test_every_change_of_a_file_changes_the_fingerprint(tmp_path):
    for name in ("train/cat/a.png", "train/dog/b.png", "test/cat/c.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"png")
    seen = [folder_fingerprint(tmp_path)]
    (tmp_path / "train/.hidden").write_bytes(b"x")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache/index").write_bytes(b"x")
    assert folder_fingerprint(tmp_path) == seen[0]  # hidden files and folders are not data
    b = tmp_path / "train/dog/b.png"
    stat = b.stat()
    os.utime(b, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # rewritten with the same bytes
    seen.append(folder_fingerprint(tmp_path))
    b.write_bytes(b"pngg")
    os.utime(b, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # another size, the same time
    seen.append(folder_fingerprint(tmp_path))
    (tmp_path / "test/cat/d.png").write_bytes(b"png")
    seen.append(folder_fingerprint(tmp_path))
    (tmp_path / "test/cat/d.png").rename(tmp_path / "test/cat/e.png")
    seen.append(folder_fingerprint(tmp_path))
    assert len(set(seen)) == len(seen), seen
    (tmp_path / "test/cat/e.png").unlink()
    assert folder_fingerprint(tmp_path) == seen[2]  # the listing of before the file came
    with pytest.raises(DataError, match="nothere: data folder not found. Point data.path"):
        folder_fingerprint(tmp_path / "nothere")


def test_the_fingerprint_hashes_paths_in_sorted_order_without_holding_them(tmp_path):
    """Folders are listed one at a time, a folder sorted as its name + "/": the order (and so the
    digest) of sorting every relative path at once, on names where the two could differ."""
    import hashlib

    from epochlens.formats.folder_listing import folder_files

    for rel in (
        "a.txt",
        "a/b/c",
        "a/b.txt",
        "ab/d",
        "a-b",
        "a b/c",
        "é/f",
        "z/y/x/w",
        "Z",
        ".hidden",
        "a/.h",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    listed = sorted(folder_files(str(tmp_path)))
    assert [rel for rel, _, _ in folder_files(str(tmp_path), ordered=True)] == [rel for rel, _, _ in listed]
    h = hashlib.sha256()
    for rel, size, mtime in listed:
        h.update(f"{rel}\0{size}\0{mtime}\n".encode())
    assert folder_fingerprint(tmp_path) == h.hexdigest()
