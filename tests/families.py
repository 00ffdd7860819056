"""Tiny random models of the recipes' architectures (Qwen3, Llama) whose tokenizers carry the families' special
tokens and their real chat templates (tests/fixtures/templates), built offline from the tiny judge's BPE.

Each family is described by what the tests check: its end-of-turn token, what the template appends after it, its
BOS handling and the text the final assistant turn starts with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
TINY_SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)


@dataclass(frozen=True)
class Family:
    name: str
    eot: str  # the end-of-turn token a completion ends with
    after_eot: str  # what the template writes after it ("\n" for ChatML)
    assistant_start: str  # the text an assistant turn's content follows, as training renders it
    bos: str | None = None  # written by the template itself


FAMILIES = {
    "tiny": Family("tiny", "<|im_end|>", "\n", "<|im_start|>assistant\n"),
    "qwen3": Family("qwen3", "<|im_end|>", "\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    "llama31": Family("llama31", "<|eot_id|>", "", "<|start_header_id|>assistant<|end_header_id|>\n\n",
                      bos="<|begin_of_text|>"),
    "llama32": Family("llama32", "<|eot_id|>", "", "<|start_header_id|>assistant<|end_header_id|>\n\n",
                      bos="<|begin_of_text|>"),
    "smollm2": Family("smollm2", "<|im_end|>", "\n", "<|im_start|>assistant\n"),
    "gemma3": Family("gemma3", "<end_of_turn>", "\n", "<start_of_turn>model\n", bos="<bos>"),
}
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"]


def _base_tokenizer(tiny_dir: str):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    base = AutoTokenizer.from_pretrained(tiny_dir)
    return Tokenizer.from_str(base.backend_tokenizer.to_str())


def qwen3_tokenizer(tiny_dir: str):
    """ChatML specials plus Qwen3's <think> / </think> (ordinary added tokens, as in Qwen3), eos <|im_end|>,
    pad <|endoftext|>, no BOS."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok = _base_tokenizer(tiny_dir)
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, additional_special_tokens=["<|im_start|>"])
    fast.chat_template = (TEMPLATES / "qwen3.jinja").read_text()
    return fast


def llama_tokenizer(tiny_dir: str, template: str = "llama3_1.jinja"):
    """Llama 3 specials; like Llama 3's tokenizer it adds <|begin_of_text|> itself on plain encoding (the template
    writes it too, so any path that encodes rendered text with special tokens doubles it)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = _base_tokenizer(tiny_dir)
    tok.add_special_tokens(LLAMA_SPECIALS)
    bos_id = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|finetune_right_pad_id|>")
    fast.chat_template = (TEMPLATES / template).read_text()
    return fast


def build_family_model(family: str, tiny_dir: str, out: Path, seed: int = 0, head_dim: int = 16, **shapes) -> str:
    """Write a tiny random model of ``family`` (qwen2: the tiny judge's tokenizer, qwen3, llama31, llama32) with its
    tokenizer into ``out``; ``shapes`` override `TINY_SHAPES` (``hidden_size / num_attention_heads`` is qwen2's head
    size)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config, Qwen3Config

    from judgetrain.models.cache import save_model_folder

    shape = {**TINY_SHAPES, **shapes}
    if family == "qwen2":
        tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
        config = Qwen2Config(vocab_size=len(tokenizer), bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, **shape)
    elif family == "qwen3":
        tokenizer = qwen3_tokenizer(tiny_dir)
        config = Qwen3Config(vocab_size=len(tokenizer), head_dim=head_dim, bos_token_id=None,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **shape)
    else:
        tokenizer = llama_tokenizer(tiny_dir, "llama3_1.jinja" if family == "llama31" else "llama3_2.jinja")
        config = LlamaConfig(vocab_size=len(tokenizer), head_dim=head_dim, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_model_folder(model, tokenizer, out)
    return str(out)
