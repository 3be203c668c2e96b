"""Tests for scripts/make_tiny_model.py (the deterministic tiny chat model)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_tiny_model.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("make_tiny_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _hashes(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


@pytest.fixture(scope="module")
def mtm():
    return _load_script()


@pytest.fixture(scope="module")
def model_dir(mtm, tmp_path_factory) -> Path:
    out = mtm.make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, layers=2)
    assert out.is_dir()
    return out


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)


def test_files_and_stamp(mtm, model_dir):
    names = {p.name for p in model_dir.iterdir()}
    for required in ("config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "generation_config.json", mtm.STAMP_NAME):
        assert required in names
    # No leftover temp build directories next to the output.
    assert [p.name for p in model_dir.parent.iterdir()] == [model_dir.name]


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.bos_token is None
    assert tokenizer.padding_side == "left"
    ids = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|pad|>"])
    assert ids == [0, 1, 2]
    assert tokenizer.eos_token_id == 1 and tokenizer.pad_token_id == 2
    # Special tokens are atomic when they appear in text.
    assert tokenizer.encode("<|im_start|>user", add_special_tokens=False)[0] == 0


def test_chat_template(tokenizer):
    messages = [
        {"role": "system", "content": "You are a strict grader."},
        {"role": "user", "content": "Grade this answer."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a strict grader.<|im_end|>\n"
        "<|im_start|>user\nGrade this answer.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text.endswith("<|im_start|>assistant\n")
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert not without.endswith("<|im_start|>assistant\n")
    multi = messages + [{"role": "assistant", "content": '{"score": 3}'}]
    assert tokenizer.apply_chat_template(multi, tokenize=False).endswith(
        '<|im_start|>assistant\n{"score": 3}<|im_end|>\n'
    )


@pytest.mark.parametrize(
    "text",
    [
        "Score: 3 ≈ 3.21 = 5 × (0.4 × 2/3 + 0.3 × 1/1)",
        "Über naïve café — “quotes” 😀👍🏽 中文 \t tabs\n\n  double  spaces ",
        '{"checklist":["fever"],"score":3,"rationale":["Fact: 2 of 3 correctly matched."]}',
        "\x00\x7f unusual bytes \u200b zero width",
    ],
)
def test_roundtrip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids
    assert max(ids) < len(tokenizer)
    assert tokenizer.decode(ids) == text


def test_model_config(tokenizer, model):
    cfg = model.config
    assert cfg.vocab_size >= len(tokenizer)
    assert cfg.vocab_size % 64 == 0
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert head_dim == 64
    assert cfg.num_hidden_layers == 2
    assert cfg.eos_token_id == tokenizer.eos_token_id
    assert cfg.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.do_sample is False


def test_forward(tokenizer, model):
    import torch

    batch = tokenizer(["short", "a somewhat longer input"], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, 0].item() == tokenizer.pad_token_id  # left padding
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape[:2] == batch["input_ids"].shape
    assert logits.shape[-1] == model.config.vocab_size
    assert torch.isfinite(logits).all()


def test_deterministic_rebuild(mtm, model_dir, tmp_path):
    again = mtm.make_tiny_model(tmp_path / "again", seed=0, layers=2)
    assert _hashes(again) == _hashes(model_dir)
    other = mtm.make_tiny_model(tmp_path / "other", seed=1, layers=2)
    h_other = _hashes(other)
    assert h_other["model.safetensors"] != _hashes(model_dir)["model.safetensors"]
    assert h_other["tokenizer.json"] == _hashes(model_dir)["tokenizer.json"]


def test_rerun_is_noop(mtm, model_dir, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert mtm.main([str(model_dir)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{model_dir}: built earlier with these arguments, reused (--force rebuilds)"
    )
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before


def test_refuses_foreign_directory(mtm, tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        mtm.make_tiny_model(tmp_path, seed=0, layers=2)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
