"""The embedded tiny judge: a real Qwen2 causal LM, randomly initialised from a seed, with a BPE tokenizer and a
ChatML chat template, built offline so the tests and the quickstart run without the Hugging Face hub.

    judgetrain tiny build --output_dir tiny-judge   # or, from Python: ensure_tiny_judge()

The directory it writes is an ordinary model directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, chat_template.jinja) that `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load. The tokenizer is trained on the bundled sample data, so a judge evaluation of
a few hundred words is a few hundred tokens and a CPU step takes well under a second. Recipes and `judgetrain eval`
accept the alias ``tiny-judge`` for it (`judgetrain.models.aliases`); it is built once per machine into the judgetrain
cache (`judgetrain.models.cache`).
"""

# Late imports: pyarrow, tokenizers, transformers, torch (inside the functions that use them): the model cache and
# aliases are read without loading a model (`judgetrain cache`, the dry run): torch and transformers come in with a
# load.

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from judgetrain.compat.transformers import without_zero3_init
from judgetrain.models.cache import cached_folder, save_model_folder

logger = logging.getLogger(__name__)

TINY_ALIAS = "tiny-judge"
_BUILDER_VERSION = 1
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Shapes: big enough to learn the bundled samples' signal in two epochs, small enough for 2 CPU cores.
DEFAULT_CONFIG = dict(
    vocab_size=2048,  # the LM head dominates a step at this size: 4096 costs 1.7x the time for 3% fewer tokens
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
# Always part of the tokenizer corpus, so digits, JSON and markdown have merges even with no samples present.
_SEED_TEXT = """```json
{"materials_appropriateness_score": 4.5, "equipment_appropriateness_score": 4.0, "procedure_completeness_score": 3.5,
 "procedure_feasibility_score": 4.0, "characterization_appropriateness_score": 4.5, "overall_score": 4.0}
```
0 1 2 3 4 5 6 7 8 9 0.5 1.0 1.5 2.0 2.5 3.0 3.5 4.0 4.5 5.0 10 100 850 1700 C K h min mL g mol %
# Heading\n## Materials\n- item\n1. Step one\n**bold** *italic* `code`
Proposal A is better. Proposal B is better.
"""


def _samples_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "samples"


def _corpus_texts() -> list[str]:
    """Text of every corpus file (`_corpus_files`), in a fixed order (the tokenizer is a function of these bytes)."""
    texts = [_SEED_TEXT]
    for path in _corpus_files():
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            for name in table.column_names:
                if str(table.schema.field(name).type) in {"string", "large_string"}:
                    texts.extend(v for v in table.column(name).to_pylist() if isinstance(v, str))
        else:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


# `judgetrain perturb`'s bundled source samples (the materials pack's recipes, which repeat the JudgeBias samples'
# text, and the quickstart's cooking recipes) stay out of the tokenizer corpus, so the tiny judge (and every figure
# measured on it) does not change with perturb's sources.
CORPUS_EXCLUDED = ("recipes", "cooking")


def _corpus_files() -> list[Path]:
    """The bundled sample files the tokenizer is trained on, in a fixed order."""
    root = _samples_dir()
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in {".json", ".jsonl", ".md", ".txt", ".parquet"}
                  and p.relative_to(root).parts[0] not in CORPUS_EXCLUDED)


def _fingerprint(config: dict, seed: int) -> str:
    """Hash of the builder inputs: config, seed and the bytes of the sample files the tokenizer is trained on.
    Raw bytes, not parsed text: parsing the parquet samples in every process that resolves the alias held ~40 MB of
    reader memory for the rest of a training run."""
    h = hashlib.sha256()
    h.update(json.dumps({"v": _BUILDER_VERSION, "config": config, "seed": seed, "seed_text": _SEED_TEXT},
                        sort_keys=True).encode())
    for path in _corpus_files():
        h.update(path.relative_to(_samples_dir()).as_posix().encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:12]


def _train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=DEFAULT_CONFIG["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_judge(out_dir: str | os.PathLike, *, seed: int = 0, config: dict | None = None) -> str:
    """Build the tiny judge into ``out_dir`` (created or overwritten) and return its path as a string."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = {**DEFAULT_CONFIG, **(config or {})}
    texts = _corpus_texts()
    tokenizer = _train_tokenizer(texts, cfg["vocab_size"])
    cfg["vocab_size"] = len(tokenizer)  # BPE may stop below the target when the corpus is small
    model_config = Qwen2Config(
        **cfg,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    # not partitioned inside a ZeRO-3 launch: one rank builds the tiny judge while the others wait for the cache
    # entry, and the saved weights must be whole
    with without_zero3_init():
        model = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = Path(out_dir)
    save_model_folder(model, tokenizer, out)  # every caller's rank writes (save_pretrained would skip rank != 0)
    (out / "judgetrain_tiny.json").write_text(
        json.dumps({"seed": seed, "config": cfg, "fingerprint": _fingerprint(cfg, seed)}, indent=1)
    )
    return str(out)


def ensure_tiny_judge(*, seed: int = 0) -> str:
    """Return the folder of the tiny judge, building it once per machine into the judgetrain cache (one process
    builds, the others wait for it; a broken entry is rebuilt)."""
    cfg = dict(DEFAULT_CONFIG)
    key = _fingerprint(cfg, seed)
    return cached_folder(
        f"{TINY_ALIAS}-{key}",
        lambda out: build_tiny_judge(out, seed=seed, config=cfg),
        info={"alias": TINY_ALIAS, "seed": seed, "fingerprint": key},
        required=("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "judgetrain_tiny.json"),
        description="the tiny judge",
    )
