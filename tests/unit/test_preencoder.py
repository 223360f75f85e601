"""The preencoder CLI and service on the tiny Qwen2-VL: per-line outcomes, interrupted assets redone,
complete ones skipped, exit codes, the HTTP endpoint."""

from __future__ import annotations

import json
import os

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from jev_common.assets import asset_key, asset_state, read_asset, read_grid
from jev_preencoder.cli import main
from jev_preencoder.service import build_app
from jev_preencoder.settings import PreencoderSettings

from .vl_helpers import png_uri, request_line, tiny_encoder, tiny_vl_checkpoint


def _manifest(tmp_path, lines: list) -> str:
    path = tmp_path / "manifest.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def _encode(tmp_path, capsys, lines, out, *extra):
    code = main(
        [
            "encode",
            "--manifest",
            _manifest(tmp_path, lines),
            "--out",
            str(out),
            "--model",
            tiny_vl_checkpoint(),
            "--redis",
            "none",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--json",
            "--no-progress",
            *extra,
        ]
    )
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    return code, report, captured.err


@pytest.fixture(autouse=True)
def _cli_env(monkeypatch):
    monkeypatch.delenv("JEV_RECIPE", raising=False)
    monkeypatch.delenv("JEV_MODEL_PATH", raising=False)
    # main() installs a stderr log handler; under capsys that stream closes after each test
    monkeypatch.setattr("jev_preencoder.cli.configure_logging", lambda _command: None)


def test_manifest_with_bad_lines_still_writes_the_good_ones(tmp_path, capsys):
    out = tmp_path / "assets"
    good = [png_uri(1), png_uri(2)]
    lines = [
        request_line(good[0]),
        request_line("https://example.com/cat.png"),
        "{this is not json",
        request_line("data:image/png;base64,@@@@"),
        request_line(good[1]),
        request_line(good[0], question="Same image, another question"),
        {"kind": "choice", "state": {"text": "no image here"}, "question": "q", "options": ["a", "b"]},
        [1, 2, 3],
        "",
    ]
    code, report, err = _encode(tmp_path, capsys, lines, out)
    assert code == 1
    assert report["summary"] | {"seconds": 0} == {
        "done": 2,
        "skipped": 1,
        "failed": 5,
        "redone": 0,
        "index_errors": 0,
        "seconds": 0,
    }
    by_line = {r["line"]: r for r in report["results"]}
    assert by_line[1]["status"] == "done" and by_line[5]["status"] == "done"
    assert by_line[2]["reason"] == "url" and "line 2" in by_line[2]["message"]
    assert by_line[3]["reason"] == "invalid_json"
    assert by_line[4]["reason"] == "malformed_base64"
    assert by_line[6]["status"] == "skipped" and by_line[6]["reason"] == "duplicate"
    assert by_line[7]["reason"] == "no_image"
    assert by_line[8]["reason"] == "not_an_object"
    assert 9 not in by_line  # a blank line is not a manifest line
    assert "2 done, 1 skipped, 5 failed" in err
    assert "FAILED line 2" in err and "[url]" in err
    for uri in good:
        key = asset_key(uri)
        assert by_line[1 if uri == good[0] else 5]["key"] == key
        assert asset_state(out, key) == "complete"
        asset = read_asset(out, key, identity=report["identity"])
        assert asset.grid_thw == (1, 4, 4) and asset.embeds.shape == (4, 64)
    assert sorted(p.name for p in out.iterdir()) == sorted([".locks"] + [asset_key(u) for u in good])


def test_rerun_skips_complete_and_redoes_interrupted(tmp_path, capsys):
    out = tmp_path / "assets"
    uris = [png_uri(s) for s in (11, 12, 13)]
    code, report, _ = _encode(tmp_path, capsys, [request_line(uris[0])], out)
    assert code == 0 and report["summary"]["done"] == 1
    complete_key = asset_key(uris[0])
    created = read_grid(out, complete_key)["created"]
    mtime = os.stat(out / complete_key / "emb.safetensors").st_mtime_ns
    # a writer killed mid-way: a leftover temp dir for one key, a final folder missing its tensor for another
    half_key, tmp_key = asset_key(uris[1]), asset_key(uris[2])
    (out / half_key).mkdir()
    (out / half_key / "grid.json").write_text(json.dumps({"grid": [1, 4, 4]}))
    leftover = out / f".tmp-{tmp_key}-deadbeef"
    leftover.mkdir()
    (leftover / "emb.safetensors").write_bytes(b"\x00" * 10)
    assert asset_state(out, half_key) == "incomplete" and asset_state(out, tmp_key) == "incomplete"
    code, report, err = _encode(tmp_path, capsys, [request_line(u) for u in uris], out)
    assert code == 0, err
    statuses = [(r["status"], r.get("reason"), r.get("redone", False)) for r in report["results"]]
    assert statuses == [("skipped", "exists", False), ("done", None, True), ("done", None, True)]
    assert report["summary"]["redone"] == 2 and "2 done, 1 skipped, 0 failed (2 redone)" in err
    assert read_grid(out, complete_key)["created"] == created
    assert os.stat(out / complete_key / "emb.safetensors").st_mtime_ns == mtime  # not rewritten
    for key in (half_key, tmp_key):
        assert asset_state(out, key) == "complete"
        assert read_asset(out, key, identity=report["identity"]).n_tokens == 4
    assert not leftover.exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]


def test_asset_for_another_checkpoint_is_redone(tmp_path, capsys):
    out = tmp_path / "assets"
    uri = png_uri(21)
    code, report, _ = _encode(tmp_path, capsys, [request_line(uri)], out)
    key = asset_key(uri)
    grid_file = out / key / "grid.json"
    record = json.loads(grid_file.read_text())
    record["identity"] = "some/other-checkpoint@abc"
    grid_file.write_text(json.dumps(record))
    code, report, _ = _encode(tmp_path, capsys, [request_line(uri)], out)
    assert code == 0 and report["results"][0]["status"] == "done" and report["results"][0]["redone"]
    assert read_grid(out, key)["identity"] == report["identity"]


def test_embeddings_are_the_vision_tower_output(tmp_path, capsys):
    """The stored tensor is get_image_features on the processor's pixels, for this exact image."""
    from .vl_helpers import pattern_image

    out = tmp_path / "assets"
    uri = png_uri(31, (112, 112))
    code, report, _ = _encode(tmp_path, capsys, [request_line(uri)], out)
    assert code == 0
    asset = read_asset(out, asset_key(uri))
    encoder = tiny_encoder()
    inputs = encoder.processor.image_processor(images=[pattern_image(31, (112, 112))], return_tensors="pt")
    with torch.inference_mode():
        expected = torch.cat(
            encoder.model.get_image_features(
                inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True
            ).pooler_output
        )
    assert asset.grid_thw == (1, 8, 8) and torch.equal(asset.embeds, expected)
    assert asset.meta["width"] == 112 and asset.meta["mime"] == "image/png"
    assert asset.meta["processor_identity"] == encoder.processor_identity
    assert report["identity"] == encoder.identity and encoder.identity.startswith("local:")


def test_size_caps_from_env_and_exit_codes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "assets"
    monkeypatch.setenv("JEV_PREENCODER_MAX_IMAGE_PIXELS", str(56 * 56))
    code, report, _ = _encode(
        tmp_path, capsys, [request_line(png_uri(41, (56, 56))), request_line(png_uri(42, (57, 56)))], out
    )
    assert code == 1
    assert [r["status"] for r in report["results"]] == ["done", "failed"]
    assert report["results"][1]["reason"] == "too_many_pixels"
    code = main(
        [
            "encode",
            "--manifest",
            str(tmp_path / "missing.jsonl"),
            "--out",
            str(out),
            "--model",
            tiny_vl_checkpoint(),
            "--redis",
            "none",
            "--no-progress",
        ]
    )
    assert code == 2
    code = main(
        [
            "encode",
            "--manifest",
            _manifest(tmp_path, []),
            "--out",
            str(out),
            "--model",
            str(tmp_path / "no-such-model"),
            "--redis",
            "none",
            "--no-progress",
        ]
    )
    assert code == 2
    assert "cannot load the model" in capsys.readouterr().err


def test_text_recipe_is_refused(tmp_path, capsys):
    code = main(
        [
            "encode",
            "--manifest",
            _manifest(tmp_path, []),
            "--out",
            str(tmp_path),
            "--recipe",
            "smollm2-135m-cpu",
            "--redis",
            "none",
            "--no-progress",
        ]
    )
    assert code == 2 and "not vision-language" in capsys.readouterr().err


async def test_service_endpoint(tmp_path):
    out = tmp_path / "assets"
    settings = PreencoderSettings(
        model_path=tiny_vl_checkpoint(),
        device="cpu",
        dtype="float32",
        asset_dir=str(out),
        redis_url="redis://127.0.0.1:1/0",
    )
    app = build_app(settings, encoder=tiny_encoder())
    async with TestClient(TestServer(app)) as client:
        for _ in range(100):  # the load task is immediate with a given encoder; let it finish
            if (await client.get("/health")).status == 200:
                break
        health = await client.get("/health")
        body = await health.json()
        assert health.status == 200 and body["status"] == "ok"
        assert body["detail"]["index"]["status"] == "degraded"  # closed port: degraded, not down
        uri = png_uri(51)
        array = [request_line(uri), request_line("http://example.com/x.png")]
        response = await client.post("/v1/preencode", json=array)
        assert response.status == 200
        data = await response.json()
        assert [r["status"] for r in data["results"]] == ["done", "failed"]
        assert data["results"][0]["indexed"] is False and data["summary"]["index_errors"] == 1
        assert asset_state(out, asset_key(uri)) == "complete"
        jsonl = json.dumps(request_line(uri)) + "\n" + "not json\n"
        response = await client.post("/v1/preencode", data=jsonl, headers={"Content-Type": "application/x-ndjson"})
        data = await response.json()
        assert [(r["status"], r.get("reason")) for r in data["results"]] == [
            ("skipped", "exists"),
            ("failed", "invalid_json"),
        ]
        empty = await client.post("/v1/preencode", data=b"  ")
        assert empty.status == 422 and (await empty.json())["detail"][0]["type"]
        metrics = await (await client.get("/metrics")).text()
        assert 'jev_preencoder_images_total{status="done"} 1.0' in metrics
        assert 'jev_preencoder_images_total{status="failed"} 2.0' in metrics
        assert "jev_preencoder_http_requests_total" in metrics


async def test_service_health_reports_a_failed_load(tmp_path):
    settings = PreencoderSettings(
        model_path=str(tmp_path / "nothing"), device="cpu", asset_dir=str(tmp_path), redis_url="none"
    )
    app = build_app(settings)
    async with TestClient(TestServer(app)) as client:
        for _ in range(200):
            response = await client.get("/health")
            if response.status == 503 and (await response.json()).get("status") == "unavailable":
                break
            await __import__("asyncio").sleep(0.01)
        assert response.status == 503
        body = await response.json()
        assert "not a folder" in body["detail"]["error"]
        post = await client.post("/v1/preencode", json=[request_line(png_uri(1))])
        assert post.status == 503 and (await post.json())["detail"]["error_type"] == "not_ready"


def test_manifest_lines_name_images_the_way_requests_send_them(tmp_path, capsys):
    """A bare image line, and a System One request with an inline asset, are the same asset as the
    single-question line with the same bytes: one key, sha256 of the image bytes."""
    out = tmp_path / "assets"
    uri = png_uri(11)
    b64 = uri.split(",", 1)[1]
    envelope = {
        "model": "jev-latest",
        "state": ["A drawing:", "<img>"],
        "questions": {"q": {"type": "noul", "instructions": "Striped?"}},
        "assets": {"<img>": {"type": "image", "format": "png", "data_base64": b64}},
    }
    two_assets = dict(envelope, assets={"<a>": envelope["assets"]["<img>"], "<b>": envelope["assets"]["<img>"]})
    lines = [{"image": uri}, envelope, request_line(uri), two_assets]
    code, report, _ = _encode(tmp_path, capsys, lines, out)
    by_line = {r["line"]: r for r in report["results"]}
    assert by_line[1]["status"] == "done" and by_line[1]["key"] == asset_key(uri)
    assert by_line[2]["status"] == "skipped" and by_line[2]["reason"] == "duplicate"
    assert by_line[3]["status"] == "skipped" and by_line[3]["reason"] == "duplicate"
    assert by_line[4]["reason"] == "no_image" and "one image per manifest line" in by_line[4]["message"]
    assert code == 1


def test_serve_reads_the_internal_token_and_encode_never_writes_one(tmp_path, monkeypatch):
    """The service is a backend of the frontend: it takes JEV_INTERNAL_TOKENS and the token file (generated there
    when missing, as the frontend and workers do); the `encode` job reads neither and leaves no file behind."""
    token_file = tmp_path / "secrets" / "internal-token"
    monkeypatch.setenv("JEV_INTERNAL_TOKENS", "t-listed")
    monkeypatch.setenv("JEV_INTERNAL_TOKEN_FILE", str(token_file))
    assert PreencoderSettings.from_env().internal_tokens == ("t-listed",) and not token_file.exists()
    tokens = PreencoderSettings.for_serving().internal_tokens
    assert tokens[0] == "t-listed" and tokens[1:] == (token_file.read_text().strip(),)
