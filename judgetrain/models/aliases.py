"""Model aliases: short names that recipes and `judgetrain eval --model` accept in place of a hub id or a folder.

Each alias names a model folder that judgetrain builds itself into its cache (`judgetrain.models.cache`), once per machine,
race-free across the processes of a launch. Anything that is not an alias (a hub id, a local folder) passes through.
"""

# Late imports: judgetrain.models (inside the functions that use them): the model cache and aliases are read without
# loading a model (`judgetrain cache`, the dry run): torch and transformers come in with a load.

from __future__ import annotations

from typing import Callable

_ALIASES: dict[str, tuple[str, Callable[[], str]]] = {}


def register_alias(name: str, ensure: Callable[[], str], description: str) -> None:
    """``ensure()`` returns the folder of the alias's model, building it into the cache when needed."""
    _ALIASES[name] = (description, ensure)


def _load_builtin() -> None:
    if _ALIASES:
        return
    from judgetrain.models import gemma3, smollm2, tiny

    register_alias(tiny.TINY_ALIAS, tiny.ensure_tiny_judge, "the embedded tiny judge (Qwen2, random init, built from a seed)")
    register_alias(
        smollm2.SMOLLM2_ALIAS, smollm2.ensure_smollm2,
        f"SmolLM2-135M-Instruct, pretrained, converted from the GGUF in {smollm2.PACKAGE} ({smollm2.INSTALL_HINT})",
    )
    register_alias(
        gemma3.GEMMA3_ALIAS, gemma3.ensure_gemma3,
        f"Gemma 3 270M, the pretrained base, converted from the GGUF in {gemma3.PACKAGE} ({gemma3.INSTALL_HINT})",
    )


def aliases() -> dict[str, str]:
    """Alias -> one-line description."""
    _load_builtin()
    return {name: desc for name, (desc, _) in _ALIASES.items()}


def is_alias(name_or_path: str) -> bool:
    _load_builtin()
    return name_or_path in _ALIASES


def resolve_model(name_or_path: str) -> str:
    """The model folder of an alias (built on first use); any other name or path unchanged."""
    _load_builtin()
    if name_or_path in _ALIASES:
        return _ALIASES[name_or_path][1]()
    return name_or_path
