import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from judgetrain.models.aliases import resolve_model
from judgetrain.models.tiny import TINY_ALIAS, build_tiny_judge


def test_tiny_judge_loads_with_auto_classes_and_has_a_chat_template(tiny_judge):
    model = AutoModelForCausalLM.from_pretrained(tiny_judge)
    tok = AutoTokenizer.from_pretrained(tiny_judge)
    assert model.config.model_type == "qwen2"
    assert (Path(tiny_judge) / "model.safetensors").is_file()
    msgs = [{"role": "system", "content": "Rate it."}, {"role": "user", "content": "Recipe: heat Li2CO3 at 850 C."}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "overall_score: 4.0"}], tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n") and full.startswith(prompt)
    ids = tok(full, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_tiny_judge_tokenizer_is_compact_on_the_bundled_samples(tiny_judge):
    # Trained on the samples, so a judge evaluation costs few tokens: that is what keeps the quickstart fast.
    tok = AutoTokenizer.from_pretrained(tiny_judge)
    text = "The recipe substitutes the element Li with Na; the overall_score is 2.5."
    assert len(tok(text)["input_ids"]) < len(text) / 2.5
    assert len(tok) > 1000


def test_tiny_judge_build_is_deterministic(tmp_path):
    a = build_tiny_judge(tmp_path / "a", seed=3)
    b = build_tiny_judge(tmp_path / "b", seed=3)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (Path(a) / name).read_bytes() == (Path(b) / name).read_bytes(), name
    meta = json.loads((Path(a) / "judgetrain_tiny.json").read_text())
    assert meta["seed"] == 3


def test_alias_resolves_to_the_cached_build(tiny_judge):
    assert resolve_model(TINY_ALIAS) == tiny_judge
    assert resolve_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


def test_perturbs_bundled_sources_stay_out_of_the_tiny_judges_tokenizer():
    """The tiny judge's tokenizer (and so its cache key, its weights' meaning and every figure measured on it) is a
    function of the bundled training and evaluation samples, not of perturb's bundled sources: adding the quickstart's
    cooking recipes changed every tiny-judge figure the tests read until they were left out."""
    from judgetrain.models.tiny import _corpus_files, _samples_dir

    sources = {"recipes", "cooking"}  # judgetrain perturb's bundled source folders
    assert sources <= {p.name for p in _samples_dir().iterdir() if p.is_dir()}
    corpus = {p.relative_to(_samples_dir()).parts[0] for p in _corpus_files()}
    assert corpus and not corpus & sources, corpus
