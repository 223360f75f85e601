"""Asset naming, data URI validation, the atomic on-disk format and its error reporting."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest
import torch

from jev_common import assets
from jev_common.assets import (
    ImageRejected,
    asset_key,
    asset_state,
    bytes_key,
    decode_data_uri,
    read_asset,
    remove_incomplete,
    write_asset,
)
from jev_common.errors import DomainError

from .vl_helpers import data_uri, pattern_image, png_uri

META = {"identity": "test/ckpt@1", "processor_identity": "proc:1", "merge_size": 2}


def _write(tmp_path, key="a" * 64, grid=(1, 4, 4), hidden=8, meta=META):
    embeds = torch.arange(grid[0] * grid[1] * grid[2] // 4 * hidden, dtype=torch.float32).reshape(-1, hidden)
    return write_asset(tmp_path, key, embeds, list(grid), dict(meta)), embeds


def test_key_is_sha256_of_the_image_bytes():
    uri = png_uri(1)
    data = base64.b64decode(uri.split(",", 1)[1])
    assert asset_key(uri) == hashlib.sha256(data).hexdigest() == bytes_key(data)
    # the same bytes give the same key however they are wrapped; other bytes another key
    assert asset_key(uri.replace("base64,", "base64,\n")) == asset_key(uri)
    assert asset_key(uri.replace("image/png", "image/jpeg")) == asset_key(uri)
    assert asset_key(png_uri(2)) != asset_key(uri)


@pytest.mark.parametrize(
    "uri, reason",
    [
        ("https://example.com/cat.png", "url"),
        ("http://example.com/cat.png", "url"),
        ("file:///etc/passwd", "url"),
        ("s3://bucket/cat.png", "url"),
        ("iVBORw0KGgo=", "not_data_uri"),
        ("data:text/plain;base64,aGVsbG8=", "not_image_type"),
        ("data:image/svg+xml;base64,PHN2Zz4=", "not_image_type"),
        ("data:image/png,rawbytes", "not_base64"),
        ("data:image/png;base64", "not_data_uri"),
        ("data:image/png;base64,", "malformed_base64"),
        ("data:image/png;base64,!!!not-base64!!!", "malformed_base64"),
        ("data:image/png;base64,abc", "malformed_base64"),  # bad padding
        ("data:image/png;base64," + base64.b64encode(b"just some text, not an image").decode(), "not_image"),
        (12345, "not_a_string"),
    ],
)
def test_bad_data_uris_are_rejected_with_a_reason(uri, reason):
    with pytest.raises(ImageRejected) as info:
        decode_data_uri(uri)
    assert info.value.reason == reason
    assert info.value.status == 422 and info.value.type == "validation_error"
    assert info.value.message


def test_truncated_png_is_not_an_image():
    raw = base64.b64decode(png_uri(2).split(",", 1)[1])
    uri = "data:image/png;base64," + base64.b64encode(raw[: len(raw) // 2]).decode()
    with pytest.raises(ImageRejected) as info:
        decode_data_uri(uri)
    assert info.value.reason == "not_image"


def test_size_caps():
    uri = png_uri(0, (200, 150))
    decoded = decode_data_uri(uri)
    assert (decoded.width, decoded.height) == (200, 150) and decoded.image.mode == "RGB"
    with pytest.raises(ImageRejected) as info:
        decode_data_uri(uri, max_pixels=200 * 150 - 1)
    assert info.value.reason == "too_many_pixels" and "200x150" in info.value.message
    decode_data_uri(uri, max_pixels=200 * 150)
    nbytes = len(base64.b64decode(uri.split(",", 1)[1]))
    with pytest.raises(ImageRejected) as info:
        decode_data_uri(uri, max_bytes=nbytes - 1)
    assert info.value.reason == "too_large"
    decode_data_uri(uri, max_bytes=nbytes)
    # a huge payload is refused before it is decoded
    with pytest.raises(ImageRejected) as info:
        decode_data_uri("data:image/png;base64," + "A" * 4_000_000, max_bytes=1 << 20)
    assert info.value.reason == "too_large"


def test_other_formats_and_whitespace_decode():
    image = pattern_image(4)
    for fmt in ("JPEG", "GIF", "WEBP"):
        decoded = decode_data_uri(data_uri(image, fmt))
        assert decoded.format == fmt and decoded.image.size == (56, 56)
    uri = png_uri(4)
    head, payload = uri.split(",", 1)
    wrapped = head + "," + "\n".join(payload[i : i + 76] for i in range(0, len(payload), 76))
    assert decode_data_uri(wrapped).image.tobytes() == decode_data_uri(uri).image.tobytes()


def test_write_read_roundtrip_and_format(tmp_path):
    folder, embeds = _write(tmp_path)
    assert folder == tmp_path / ("a" * 64)
    assert sorted(p.name for p in folder.iterdir()) == ["emb.safetensors", "grid.json"]
    grid = json.loads((folder / "grid.json").read_text())
    assert grid["grid"] == [1, 4, 4] and grid["shape"] == [4, 8] and grid["dtype"] == "float32"
    assert grid["identity"] == META["identity"] and grid["processor_identity"] == META["processor_identity"]
    assert grid["created"].endswith("Z") and grid["n_tokens"] == 4 and grid["nbytes"] == 4 * 8 * 4
    assert asset_state(tmp_path, "a" * 64) == "complete"
    asset = read_asset(tmp_path, "a" * 64, identity=META["identity"], processor_identity=META["processor_identity"])
    assert asset.grid_thw == (1, 4, 4) and asset.nbytes == 128 and torch.equal(asset.embeds, embeds)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_bfloat16_embeddings_keep_their_dtype(tmp_path):
    embeds = torch.randn(4, 8).to(torch.bfloat16)
    write_asset(tmp_path, "b" * 64, embeds, [1, 4, 4], dict(META))
    asset = read_asset(tmp_path, "b" * 64)
    assert asset.embeds.dtype == torch.bfloat16 and asset.nbytes == 4 * 8 * 2
    assert asset.meta["dtype"] == "bfloat16"


def test_missing_asset_names_the_hash(tmp_path):
    key = asset_key(png_uri(9))
    with pytest.raises(DomainError) as info:
        read_asset(tmp_path, key)
    assert (info.value.status, info.value.type) == (422, "asset_not_prepared")
    assert f"sha256:{key}" in info.value.message and "preencoder" in info.value.message


def test_incomplete_asset_is_not_prepared_and_removable(tmp_path):
    folder, _ = _write(tmp_path)
    (folder / "emb.safetensors").unlink()
    assert asset_state(tmp_path, "a" * 64) == "incomplete"
    with pytest.raises(DomainError) as info:
        read_asset(tmp_path, "a" * 64)
    assert info.value.type == "asset_not_prepared" and "emb.safetensors missing" in info.value.message
    leftover = tmp_path / f".tmp-{'c' * 64}-dead"
    leftover.mkdir()
    (leftover / "emb.safetensors").write_bytes(b"half")
    assert asset_state(tmp_path, "c" * 64) == "incomplete"
    assert set(remove_incomplete(tmp_path, "a" * 64)) == {"a" * 64}
    assert set(remove_incomplete(tmp_path, "c" * 64)) == {leftover.name}
    assert asset_state(tmp_path, "a" * 64) == "absent" and asset_state(tmp_path, "c" * 64) == "absent"


def test_corrupt_assets_are_invalid(tmp_path):
    folder, _ = _write(tmp_path)
    (folder / "grid.json").write_text("{not json")
    assert asset_state(tmp_path, "a" * 64) == "incomplete"  # unparseable grid.json: redo it
    with pytest.raises(DomainError) as info:
        read_asset(tmp_path, "a" * 64)
    assert info.value.type == "asset_invalid" and "a" * 64 in info.value.message
    folder, _ = _write(tmp_path)
    (folder / "emb.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(DomainError) as info:
        read_asset(tmp_path, "a" * 64)
    assert info.value.type == "asset_invalid" and "emb.safetensors" in info.value.message
    folder, _ = _write(tmp_path)
    grid = json.loads((folder / "grid.json").read_text())
    grid["grid"] = [1, 8, 8]  # says 16 tokens, the file has 4
    (folder / "grid.json").write_text(json.dumps(grid))
    with pytest.raises(DomainError) as info:
        read_asset(tmp_path, "a" * 64)
    assert info.value.type == "asset_invalid" and "needs 16 rows" in info.value.message


def test_identity_mismatch_is_an_error_not_a_silent_reuse(tmp_path):
    _write(tmp_path)
    with pytest.raises(DomainError) as info:
        read_asset(tmp_path, "a" * 64, identity="another/ckpt@2")
    assert info.value.type == "asset_invalid" and "test/ckpt@1" in info.value.message
    with pytest.raises(DomainError) as info:
        read_asset(tmp_path, "a" * 64, identity=META["identity"], processor_identity="proc:other")
    assert info.value.type == "asset_invalid" and "image processor" in info.value.message


def test_rewrite_replaces_atomically_and_failed_write_leaves_nothing(tmp_path, monkeypatch):
    _write(tmp_path)
    _write(tmp_path, meta={**META, "identity": "new/ckpt@2"})
    assert read_asset(tmp_path, "a" * 64, identity="new/ckpt@2").meta["identity"] == "new/ckpt@2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks", "a" * 64]

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        _write(tmp_path, key="d" * 64)
    assert asset_state(tmp_path, "d" * 64) == "absent"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks", "a" * 64]


def test_write_checks_its_inputs(tmp_path):
    with pytest.raises(ValueError, match="identity"):
        write_asset(tmp_path, "a" * 64, torch.zeros(4, 8), [1, 4, 4], {"processor_identity": "p"})
    with pytest.raises(ValueError, match="4 tokens"):
        write_asset(tmp_path, "a" * 64, torch.zeros(5, 8), [1, 4, 4], dict(META))
    with pytest.raises(ValueError, match="64 lowercase hex"):
        write_asset(tmp_path, "../escape", torch.zeros(4, 8), [1, 4, 4], dict(META))
    assert not os.listdir(tmp_path) or os.listdir(tmp_path) == [assets.LOCK_DIR]
