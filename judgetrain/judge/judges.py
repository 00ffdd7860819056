"""Judge specifications (``--judge`` / ``--judges_file``) and the generators that run them.

A ``--judge`` value is a bare model (an alias such as ``tiny-judge`` or ``smollm2-135m-instruct``, a hub id, a local
folder) or comma-separated ``key=value`` pairs:

- a local model: ``model=M,adapter=PATH,name=N`` (``adapter``: a LoRA adapter folder or a training checkpoint
  holding one; without ``model`` the adapter's base model is loaded);
- an OpenAI-compatible endpoint: ``endpoint=BASE_URL,model=NAME,key_env=VAR,name=N`` (the key is read from the
  environment variable ``VAR``, never from a file, and never written to the output).

``--judges_file FILE.yaml`` is a list of mappings with the same keys. ``name`` is the ``judge_model`` written in every
output row; without one it is the model's name (plus the adapter's folder name).
"""

# Late imports: yaml, transformers, judgetrain.models, torch, peft (inside the functions that use them): items are
# read and checked before any model loads: the model libraries come in when a judge is loaded.

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judgetrain.utils.errors import BadInputError

logger = logging.getLogger(__name__)

KEYS = ("model", "adapter", "name", "endpoint", "key_env")


class JudgeSpecError(BadInputError, ValueError):
    """A judge specification that cannot be used (named in the message)."""


@dataclass(frozen=True)
class JudgeSpec:
    name: str
    model: str | None = None
    adapter: str | None = None
    endpoint: str | None = None
    key_env: str | None = None

    @property
    def is_endpoint(self) -> bool:
        return self.endpoint is not None

    def identity(self) -> dict[str, Any]:
        """What a resume compares: the names, and the adapter's weights by SHA-256 (a retrained adapter in the same
        folder is another judge). The endpoint's key is not part of it: it is never written anywhere."""
        out: dict[str, Any] = {"name": self.name, "model": self.model, "adapter": self.adapter,
                               "endpoint": self.endpoint, "key_env": self.key_env}
        if self.adapter:
            out["adapter_sha256"] = adapter_digest(self.adapter)
        return out


def _default_name(model: str | None, adapter: str | None) -> str:
    base = Path(model).name if model and Path(model).expanduser().exists() else (model or "")
    if not adapter:
        return base
    path = Path(adapter)
    tail = f"{path.parent.name}/{path.name}" if path.name.startswith("checkpoint-") else path.name
    return f"{base}+{tail}" if base else tail


def make_spec(fields: dict[str, Any], where: str) -> JudgeSpec:
    unknown = sorted(set(fields) - set(KEYS))
    if unknown:
        raise JudgeSpecError(f"{where}: unknown key(s) {', '.join(unknown)}; a judge takes {', '.join(KEYS)}")
    clean = {k: str(v).strip() for k, v in fields.items() if v is not None and str(v).strip()}
    if "endpoint" in clean:
        if "model" not in clean:
            raise JudgeSpecError(f"{where}: an endpoint judge needs model=NAME (the name the server serves)")
        if "adapter" in clean:
            raise JudgeSpecError(f"{where}: an endpoint judge takes no adapter (the server serves its weights)")
    elif "key_env" in clean:
        raise JudgeSpecError(f"{where}: key_env is for endpoint judges (endpoint=BASE_URL)")
    elif "model" not in clean and "adapter" not in clean:
        raise JudgeSpecError(f"{where}: a judge needs model=M (or adapter=PATH, whose base model is loaded)")
    name = clean.get("name") or (clean["model"] if "endpoint" in clean else
                                 _default_name(clean.get("model"), clean.get("adapter")))
    return JudgeSpec(name, clean.get("model"), clean.get("adapter"), clean.get("endpoint"), clean.get("key_env"))


def parse_judge(value: str) -> JudgeSpec:
    """One ``--judge`` value (see the module doc)."""
    value = value.strip()
    if not value:
        raise JudgeSpecError("--judge: empty value")
    if "=" not in value:
        return make_spec({"model": value}, f"--judge {value!r}")
    fields: dict[str, str] = {}
    for part in value.split(","):
        key, sep, val = part.partition("=")
        if not sep:
            raise JudgeSpecError(f"--judge {value!r}: {part!r} is not key=value")
        if key.strip() in fields:
            raise JudgeSpecError(f"--judge {value!r}: {key.strip()} given twice")
        fields[key.strip()] = val
    return make_spec(fields, f"--judge {value!r}")


def read_judges_file(path: str) -> list[JudgeSpec]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise JudgeSpecError(f"--judges_file {path}: cannot read it: {e}") from None
    if isinstance(data, dict) and "judges" in data:
        data = data["judges"]
    if not isinstance(data, list) or not data:
        raise JudgeSpecError(f"--judges_file {path}: expected a non-empty list of judges (mappings of {', '.join(KEYS)})")
    specs = []
    for i, entry in enumerate(data):
        if isinstance(entry, str):
            specs.append(parse_judge(entry))
        elif isinstance(entry, dict):
            specs.append(make_spec(entry, f"--judges_file {path} entry {i}"))
        else:
            raise JudgeSpecError(f"--judges_file {path} entry {i}: expected a mapping, got {type(entry).__name__}")
    return specs


def judge_specs(values: list[str] | None, judges_file: str | None) -> list[JudgeSpec]:
    """Every judge, in order (``--judges_file``'s then ``--judge``'s); names must differ."""
    specs = (read_judges_file(judges_file) if judges_file else []) + [parse_judge(v) for v in values or []]
    if not specs:
        raise JudgeSpecError("no judge: give --judge MODEL (repeatable) or --judges_file FILE.yaml")
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise JudgeSpecError(f"judges {seen[spec.name]} and {i} are both named {spec.name!r}: give each a "
                                 "name=... (it is the judge_model of the output rows)")
        seen[spec.name] = i
        if spec.adapter and not (Path(spec.adapter) / "adapter_config.json").is_file():
            raise JudgeSpecError(f"judge {spec.name!r}: adapter {spec.adapter} has no adapter_config.json (a LoRA "
                                 "adapter folder, or a training checkpoint of a LoRA run)")
    return specs


def adapter_digest(adapter: str) -> str:
    """SHA-256 over the adapter's config and weight files."""
    h = hashlib.sha256()
    folder = Path(adapter)
    for path in sorted(folder.glob("adapter_*")):
        if path.is_file():
            h.update(path.name.encode() + b"\0")
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ local models
def load_local(spec: JudgeSpec, *, dtype: str = "auto", trust_remote_code: bool = False, device=None):
    """(model, tokenizer) of a local judge: the base model (alias, hub id or folder), its adapter applied."""
    from transformers import AutoModelForCausalLM

    from judgetrain.models.aliases import resolve_model
    from judgetrain.models.loading import load_tokenizer

    base = spec.model
    if base is None:
        base = json.loads((Path(spec.adapter) / "adapter_config.json").read_text())["base_model_name_or_path"]
    path = resolve_model(base)
    import torch

    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto" if dtype == "auto" else getattr(torch, dtype),
                                                 trust_remote_code=trust_remote_code)
    own = spec.adapter and (Path(spec.adapter) / "tokenizer_config.json").is_file()
    tokenizer = load_tokenizer(spec.adapter if own else path, trust_remote_code=trust_remote_code)
    if spec.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, spec.adapter)
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer
