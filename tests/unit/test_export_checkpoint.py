"""tools/export_checkpoint.py on a tiny random Llama (built here) and a LoRA crafted by hand."""

from __future__ import annotations

import hashlib
import json
import math
import weakref
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from jev_common.recipe import Recipe
from tools import export_checkpoint as ec

VOCAB = 512
RANK, ALPHA = 4, 8.0
SCALE = ALPHA / RANK
LORA_TARGETS = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")


def _tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0}
    for word in [chr(65 + i) for i in range(26)] + ["Yes", "No"]:
        vocab[word] = len(vocab)
    while len(vocab) < VOCAB:
        vocab[f"w{len(vocab)}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer Llama, vocab 512, FP32 weights in 4+ shards; a LoRA on q/v/down projections and the LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("export")
    model_dir, lora_dir = root / "base", root / "lora"
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(model_dir, safe_serialization=True, max_shard_size="40KB")
    _tokenizer(model_dir)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}

    lora_dir.mkdir()
    generator = torch.Generator().manual_seed(1)
    adapter, targets = {}, []
    modules = [f"model.layers.{i}.{t}" for i in range(2) for t in LORA_TARGETS] + ["lm_head"]
    for module in modules:
        out_f, in_f = base[module + ".weight"].shape
        adapter[f"base_model.model.{module}.lora_A.weight"] = torch.randn(RANK, in_f, generator=generator) * 0.3
        adapter[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_f, RANK, generator=generator) * 0.3
        targets.append(module.split(".")[-1])
    save_file(adapter, str(lora_dir / "adapter_model.safetensors"))
    (lora_dir / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": RANK,
                "lora_alpha": ALPHA,
                "target_modules": sorted(set(targets)),
                "fan_in_fan_out": False,
                "use_rslora": False,
                "bias": "none",
            }
        )
    )
    return {
        "root": root,
        "model": model_dir,
        "lora": lora_dir,
        "base": base,
        "adapter": adapter,
        "modules": modules,
        "config": config,
    }


def _expected(tiny, dtype=torch.bfloat16):
    """Every exported tensor, computed independently: merge in FP32, then round."""
    expected, fp32 = {}, {}
    for name, weight in tiny["base"].items():
        module = name.removesuffix(".weight")
        if module in tiny["modules"] and name.endswith(".weight"):
            a = tiny["adapter"][f"base_model.model.{module}.lora_A.weight"].float()
            b = tiny["adapter"][f"base_model.model.{module}.lora_B.weight"].float()
            merged = weight.float() + SCALE * (b @ a)
        else:
            merged = weight.float()
        fp32[name] = merged
        expected[name] = merged.to(dtype)
    return expected, fp32


def _exported(out: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        tensors.update(load_file(str(shard)))
    return tensors


@pytest.fixture(scope="module")
def exported(tiny):
    out = tiny["root"] / "out"
    ec.export_checkpoint(tiny["model"], out, lora_dir=tiny["lora"], label_ids=[1, 2, 3, 27, 28], log=lambda *_: None)
    return out


def test_source_really_is_sharded(tiny):
    shards = sorted(tiny["model"].glob("model-*.safetensors"))
    assert len(shards) >= 3
    assert (tiny["model"] / ec.INDEX_FILE).is_file()


def test_merged_weights_equal_fp32_merge_then_round(tiny, exported):
    expected, _ = _expected(tiny)
    got = _exported(exported)
    assert set(got) == set(expected)
    changed = 0
    for name, tensor in got.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, expected[name]), name
        if not torch.equal(tensor, tiny["base"][name].to(torch.bfloat16)):
            changed += 1
    assert changed == len(tiny["modules"])  # exactly the LoRA targets moved


def test_merge_differs_from_rounding_first(tiny, exported):
    """Rounding W to BF16 before adding the delta gives other bits somewhere: the order is observable."""
    got = _exported(exported)
    module = tiny["modules"][0]
    w = tiny["base"][module + ".weight"]
    a = tiny["adapter"][f"base_model.model.{module}.lora_A.weight"]
    b = tiny["adapter"][f"base_model.model.{module}.lora_B.weight"]
    round_first = (w.to(torch.bfloat16) + (SCALE * (b @ a)).to(torch.bfloat16)).to(torch.bfloat16)
    assert not torch.equal(got[module + ".weight"], round_first)


def test_exported_shards_and_index(tiny, exported):
    src = sorted(p.name for p in tiny["model"].glob("model-*.safetensors"))
    dst = sorted(p.name for p in exported.glob("model-*.safetensors"))
    assert src == dst
    index = json.loads((exported / ec.INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(tiny["base"])
    total = 0
    for shard in dst:
        with safe_open(str(exported / shard), framework="pt") as handle:
            assert handle.metadata() == {"format": "pt"}
            for key in handle.keys():
                assert index["weight_map"][key] == shard
                sl = handle.get_slice(key)
                total += math.prod(sl.get_shape()) * 2
    assert index["metadata"]["total_size"] == total


def test_from_pretrained_loads_and_matches(tiny, exported):
    from transformers import AutoTokenizer, LlamaForCausalLM

    loaded = LlamaForCausalLM.from_pretrained(exported, dtype=torch.bfloat16).eval()
    expected, _ = _expected(tiny)
    state = loaded.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    # the unmerged base loaded the same way, then given the independently merged weights
    reference = LlamaForCausalLM.from_pretrained(tiny["model"], dtype=torch.bfloat16).eval()
    reference.load_state_dict(expected, strict=True)
    ids = torch.tensor([[5, 17, 3, 99, 400, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, reference(ids).logits)
    assert json.loads((exported / "config.json").read_text())["dtype"] == "bfloat16"
    tokenizer = AutoTokenizer.from_pretrained(exported)
    assert tokenizer.encode("B", add_special_tokens=False) == [2]


def test_head_rows_are_exact_fp32_of_the_merged_head(tiny, exported):
    _, fp32 = _expected(tiny)
    head = load_file(str(exported / ec.HEAD_FILE))
    assert head["weight"].dtype == torch.float32
    assert head["token_ids"].tolist() == [1, 2, 3, 27, 28]
    assert torch.equal(head["weight"], fp32["lm_head.weight"][[1, 2, 3, 27, 28]])
    # FP32 rows keep bits the BF16 head lost
    assert not torch.equal(head["weight"], fp32["lm_head.weight"][[1, 2, 3, 27, 28]].to(torch.bfloat16).float())


def test_manifest_lists_every_file_with_correct_hashes(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["format"] == ec.MANIFEST_FORMAT
    listed = {item["path"]: item for item in manifest["files"]}
    on_disk = {p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file()}
    assert set(listed) == on_disk - {"manifest.json"}
    for path, item in listed.items():
        data = (exported / path).read_bytes()
        assert item["size"] == len(data)
        assert item["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["lora"]["scales"] == [SCALE]
    assert manifest["lora"]["merged_tensors"] == 7
    assert ec.verify_manifest(exported) == []


def test_verify_manifest_notices_a_changed_file(tiny, tmp_path):
    out = tmp_path / "o"
    ec.export_checkpoint(tiny["model"], out, log=lambda *_: None)
    shard = sorted(out.glob("model-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    (out / "stray.txt").write_text("x")
    problems = ec.verify_manifest(out)
    assert f"changed {shard.name}" in problems and "unlisted stray.txt" in problems


def test_existing_output_dir_is_refused(tiny, exported, tmp_path):
    before = {p.name: p.stat().st_mtime_ns for p in exported.iterdir()}
    with pytest.raises(FileExistsError):
        ec.export_checkpoint(tiny["model"], exported, log=lambda *_: None)
    assert {p.name: p.stat().st_mtime_ns for p in exported.iterdir()} == before
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileExistsError):
        ec.export_checkpoint(tiny["model"], empty, log=lambda *_: None)
    assert list(empty.iterdir()) == []
    assert ec.main(["--model", str(tiny["model"]), "--out", str(empty)]) == 2


def test_tensors_are_streamed_one_at_a_time(tiny, tmp_path, monkeypatch):
    """Every tensor is loaded once, and the previous one is gone by the time the next is loaded."""
    loads, alive_at_load = [], []
    refs: list[weakref.ref] = []
    real = ec._load_tensor

    def tracking(handle, name):
        alive_at_load.append(sum(r() is not None for r in refs))
        tensor = real(handle, name)
        refs.append(weakref.ref(tensor))
        loads.append(name)
        return tensor

    monkeypatch.setattr(ec, "_load_tensor", tracking)
    ec.export_checkpoint(tiny["model"], tmp_path / "s", lora_dir=tiny["lora"], label_ids=[4], log=lambda *_: None)
    assert sorted(loads) == sorted(tiny["base"])  # each tensor exactly once
    assert max(alive_at_load) == 0
    # shard by shard: the load order follows the shard files
    index = json.loads((tiny["model"] / ec.INDEX_FILE).read_text())["weight_map"]
    shard_order = [index[name] for name in loads]
    assert shard_order == sorted(shard_order)


def test_labels_from_recipe_verbalizer_via_tokenizer(tiny, tmp_path):
    recipe = Recipe.model_validate(
        {
            "name": "t",
            "family": "t",
            "compose_profile": "cpu",
            "model": {"hub_repo": "x/y", "revision": "r", "architecture": "LlamaForCausalLM"},
            "verbalizer": {"labels": "ABCD", "yes": "Yes", "no": "No"},
        }
    )
    out = tmp_path / "r"
    manifest = ec.export_checkpoint(tiny["model"], out, recipe=recipe, dtype="float32", log=lambda *_: None)
    head = load_file(str(out / ec.HEAD_FILE))
    assert head["token_ids"].tolist() == [1, 2, 3, 4, 27, 28]
    assert manifest["decision_head"]["labels"] == ["A", "B", "C", "D", "Yes", "No"]
    assert torch.equal(head["weight"], tiny["base"]["lm_head.weight"][[1, 2, 3, 4, 27, 28]])
    assert all(t.dtype == torch.float32 for t in _exported(out).values())


def test_multi_token_label_is_an_error(tiny, tmp_path):
    with pytest.raises(ec.ExportError, match="not one"):
        ec.export_checkpoint(tiny["model"], tmp_path / "m", labels=["A B"], log=lambda *_: None)
    assert not (tmp_path / "m").exists()


def test_adapter_that_matches_nothing_is_an_error_and_leaves_no_output(tiny, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(
        {
            "base_model.model.model.layers.0.self_attn.nope.lora_A.weight": torch.zeros(4, 32),
            "base_model.model.model.layers.0.self_attn.nope.lora_B.weight": torch.zeros(32, 4),
        },
        str(bad / "adapter_model.safetensors"),
    )
    (bad / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    with pytest.raises(ec.ExportError, match="matches no tensor"):
        ec.export_checkpoint(tiny["model"], tmp_path / "x", lora_dir=bad, log=lambda *_: None)
    assert not (tmp_path / "x").exists() and not (tmp_path / ".x.partial").exists()


def test_dora_is_refused(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "use_dora": True}))
    with pytest.raises(ec.ExportError, match="DoRA"):
        ec.LoraAdapter.load(tmp_path)


def test_rslora_and_patterns_set_the_scale(tmp_path):
    save_file(
        {
            "base_model.model.a.q_proj.lora_A.weight": torch.zeros(2, 3),
            "base_model.model.a.q_proj.lora_B.weight": torch.zeros(3, 2),
            "base_model.model.a.v_proj.lora_A.weight": torch.zeros(2, 3),
            "base_model.model.a.v_proj.lora_B.weight": torch.zeros(3, 2),
        },
        str(tmp_path / "adapter_model.safetensors"),
    )
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"r": 16, "lora_alpha": 32, "use_rslora": True, "alpha_pattern": {"v_proj": 64}})
    )
    adapter = ec.LoraAdapter.load(tmp_path)
    assert adapter.pairs["a.q_proj.weight"].scale == pytest.approx(32 / 4)
    assert adapter.pairs["a.v_proj.weight"].scale == pytest.approx(64 / 4)


def test_embedding_lora_and_modules_to_save(tiny, tmp_path):
    emb = tiny["base"]["model.embed_tokens.weight"]
    a = torch.randn(RANK, VOCAB)  # lora_embedding_A: (r, num_embeddings)
    b = torch.randn(emb.shape[1], RANK)  # lora_embedding_B: (dim, r)
    norm = torch.full_like(tiny["base"]["model.norm.weight"], 0.5)
    adapter_dir = tmp_path / "emb"
    adapter_dir.mkdir()
    save_file(
        {
            "base_model.model.model.embed_tokens.lora_embedding_A": a,
            "base_model.model.model.embed_tokens.lora_embedding_B": b,
            "base_model.model.model.norm.modules_to_save.default.weight": norm,
        },
        str(adapter_dir / "adapter_model.safetensors"),
    )
    (adapter_dir / "adapter_config.json").write_text(json.dumps({"r": RANK, "lora_alpha": ALPHA}))
    out = tmp_path / "e"
    ec.export_checkpoint(tiny["model"], out, lora_dir=adapter_dir, log=lambda *_: None)
    got = _exported(out)
    assert torch.equal(got["model.embed_tokens.weight"], (emb.float() + SCALE * (b @ a).T).to(torch.bfloat16))
    assert torch.equal(got["model.norm.weight"], norm.to(torch.bfloat16))


def test_cli_round_trip(tiny, tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        ec.main(
            [
                "--model",
                str(tiny["model"]),
                "--out",
                str(out),
                "--lora",
                str(tiny["lora"]),
                "--labels",
                "A,B,Yes",
                "--max-length",
                "4096",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["decision_head"]["token_ids"] == [1, 2, 27]
    assert manifest["max_length"] == 4096
    assert ec.main(["--out", str(out), "--model", "-", "--verify"]) == 0
    assert "manifest: ok" in capsys.readouterr().out


def test_streaming_writer_output_is_readable_by_safetensors(tmp_path):
    tensors = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor(7, dtype=torch.int64),
        "c": torch.randn(3, 1).to(torch.bfloat16),
        "d": torch.zeros(0, 4),
    }
    entries = [ec._Entry(k, ec._torch_to_st(v.dtype), tuple(v.shape)) for k, v in tensors.items()]
    writer = ec.StreamingSafetensorsWriter(tmp_path / "w.safetensors", entries, metadata={"format": "pt"})
    for name, tensor in tensors.items():
        writer.write(name, tensor)
    writer.close()
    back = load_file(str(tmp_path / "w.safetensors"))
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    with pytest.raises(ec.ExportError, match="never written"):
        ec.StreamingSafetensorsWriter(tmp_path / "x.safetensors", entries).close()


def test_recipe_wrapper_merges_subfolder_adapter_and_copies_extras(tiny, tmp_path):
    import shutil

    repo = tmp_path / "adapter-repo"
    shutil.copytree(tiny["lora"], repo / "text")
    (repo / "text" / "calibration.json").write_text(json.dumps({"temperature": 1.3}))
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(
        "name: w\nfamily: w\ncompose_profile: cpu\n"
        "model: {hub_repo: x/y, revision: r, architecture: LlamaForCausalLM}\n"
        "verbalizer: {labels: AB, 'yes': 'Yes', 'no': 'No'}\n"
    )
    out = tmp_path / "w"
    assert (
        ec.recipe_export_main(
            str(recipe_file),
            adapter_subdir="text",
            extra_globs=["*.json"],
            argv=["--base", str(tiny["model"]), "--adapter", str(repo), "--out", str(out)],
        )
        == 0
    )
    expected, fp32 = _expected(tiny)
    got = _exported(out)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    head = load_file(str(out / ec.HEAD_FILE))
    assert head["token_ids"].tolist() == [1, 2, 27, 28]
    assert json.loads((out / "adapter_extras" / "calibration.json").read_text()) == {"temperature": 1.3}
    assert not (out / "adapter_extras" / "adapter_config.json").exists()
    assert ec.verify_manifest(out) == []


def test_head_ids_from_json_finds_nested_ids_or_fails(tmp_path):
    good = tmp_path / "h.json"
    good.write_text(json.dumps({"version": 1, "head": {"label_token_ids": [32, 33, 34], "temperature": 0.7}}))
    assert ec.head_ids_from_json(good) == [32, 33, 34]
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"labels": ["A", "B"]}))
    with pytest.raises(ec.ExportError, match="--label-ids"):
        ec.head_ids_from_json(bad)
