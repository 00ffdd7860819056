"""Judge specifications (``--judge`` / ``--judges_file``) and the generators that run them.

A ``--judge`` value is a bare model (an alias such as ``tiny-judge`` or ``smollm2-135m-instruct``, a hub id, a local
folder) or comma-separated ``key=value`` pairs:

- a local model: ``model=M,adapter=PATH,name=N`` (``adapter``: a LoRA adapter folder or a training checkpoint
  holding one; without ``model`` the adapter's base model is loaded);
- an OpenAI-compatible endpoint: ``endpoint=BASE_URL,model=NAME,key_env=VAR,name=N`` (the key is read from the
  environment variable ``VAR``, never from a file, and never written to the output).

An endpoint judge also takes ``timeout_s``, ``max_retries`` and ``wait_budget_s`` (its own values of
``--endpoint_timeout_s``, ``--endpoint_max_retries`` and ``--endpoint_wait_budget_s``) and ``retry_rejected`` (true /
false: its own ``--retry_rejected``, the rows its server refused generated again); a local judge takes
``gpu_memory_utilization`` (its own ``--gpu_memory_utilization``: the share of the GPU its vLLM engine may take).

``--judges_file FILE.yaml`` is a list of mappings with the same keys. ``name`` is the ``judge_model`` written in every
output row; without one it is the model's name (plus the adapter's folder name).

Identity (what a resume compares, `JudgeSpec.identity`): a local judge's weights are named by a fingerprint of its
folder (`weights_fingerprint`) or, for a hub id, the commit its branch resolves to, and an adapter by the SHA-256 of
its files; an endpoint judge by its model name and the id the server lists it under (`preflight_endpoints`), not by
the URL, so a job requeued onto a server on another host resumes.
"""

# Late imports: yaml, transformers, torch, peft, judgetrain.models, judgetrain.utils, judgetrain.run, judgetrain.judge,
# judgetrain.checks
# (inside the functions that use them): a finished run is decided and the judges are checked before torch is imported
# (judgetrain.judge.resume); the model libraries come in when a judge is loaded.

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judgetrain.judge.options import check_settings
from judgetrain.utils.errors import BadInputError

logger = logging.getLogger(__name__)

ENDPOINT_SETTINGS = {"timeout_s": float, "max_retries": int, "wait_budget_s": float}
LOCAL_SETTINGS = {"gpu_memory_utilization": float}
KEYS = ("model", "adapter", "name", "endpoint", "key_env", "retry_rejected", *ENDPOINT_SETTINGS, *LOCAL_SETTINGS)
FLAGS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
FINGERPRINT_SAMPLES = 16  # blocks read from each weight file, evenly spaced
FINGERPRINT_BLOCK = 1 << 16


class JudgeSpecError(BadInputError, ValueError):
    """A judge specification that cannot be used (named in the message)."""


@dataclass(frozen=True)
class JudgeSpec:
    name: str
    model: str | None = None
    adapter: str | None = None
    endpoint: str | None = None
    key_env: str | None = None
    timeout_s: float | None = None  # endpoint settings of this judge (None: the command's)
    max_retries: int | None = None
    wait_budget_s: float | None = None
    gpu_memory_utilization: float | None = None  # a local judge's vLLM share of the GPU (None: the command's)
    served_model: str | None = None  # the id the endpoint's model list gives the model (`preflight_endpoints`)
    retry_rejected: bool | None = None  # rows the endpoint refused generated again (None: the command's)

    def retries_rejected(self, opts) -> bool:
        """Whether this judge's rows its endpoint refused are generated again: its own ``retry_rejected``, else the
        command's ``--retry_rejected``."""
        return bool(opts.retry_rejected if self.retry_rejected is None else self.retry_rejected)

    @property
    def is_endpoint(self) -> bool:
        return self.endpoint is not None

    def identity(self, resolve: bool = True) -> dict[str, Any]:
        """What a resume compares (`judgetrain.judge.output.identity_differences` compares the keys both runs
        recorded). A local judge: its names, its weights (``weights``: `weights_fingerprint` of a folder, or
        ``hub:<commit>``; ``resolve=False`` leaves out what would build an alias or ask the hub) and its adapter's
        SHA-256. An endpoint judge: its name, model and ``served_model`` (once the preflight has asked the server),
        not the URL or the key variable. The key is never part of it."""
        out: dict[str, Any] = {"name": self.name, "model": self.model, "kind": "endpoint" if self.is_endpoint
                               else "local"}
        if self.is_endpoint:
            if self.served_model is not None:
                out["served_model"] = self.served_model
            return out
        out["adapter"] = self.adapter
        weights = weights_identity(self.base_model(), resolve)
        if weights is not None:
            out["weights"] = weights
        if self.adapter:
            out["adapter_sha256"] = adapter_digest(self.adapter)
        return out

    def base_model(self) -> str:
        """The model a local judge loads (its adapter's base when no model is given)."""
        if self.model is not None:
            return self.model
        return json.loads((Path(self.adapter) / "adapter_config.json").read_text())["base_model_name_or_path"]


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
        if "adapter" in clean or set(clean) & set(LOCAL_SETTINGS):
            raise JudgeSpecError(f"{where}: an endpoint judge takes no adapter or gpu_memory_utilization (the server "
                                 "serves its weights)")
    elif endpoint_only := sorted(set(clean) & {"key_env", "retry_rejected", *ENDPOINT_SETTINGS}):
        raise JudgeSpecError(f"{where}: {', '.join(endpoint_only)} "
                             "is for endpoint judges (endpoint=BASE_URL)")
    elif "model" not in clean and "adapter" not in clean:
        raise JudgeSpecError(f"{where}: a judge needs model=M (or adapter=PATH, whose base model is loaded)")
    settings: dict[str, Any] = {}
    for key, kind in {**ENDPOINT_SETTINGS, **LOCAL_SETTINGS}.items():
        if key in clean:
            try:
                settings[key] = kind(clean[key])
            except ValueError:
                raise JudgeSpecError(f"{where}: {key}={clean[key]!r} is not a{'n integer' if kind is int else ' number'}"
                                     ) from None
    try:
        check_settings(**settings)
    except ValueError as e:
        raise JudgeSpecError(f"{where}: {e}") from None
    if "retry_rejected" in clean:
        if clean["retry_rejected"].lower() not in FLAGS:
            raise JudgeSpecError(f"{where}: retry_rejected={clean['retry_rejected']!r} is not true or false")
        settings["retry_rejected"] = FLAGS[clean["retry_rejected"].lower()]
    name = clean.get("name") or (clean["model"] if "endpoint" in clean else
                                 _default_name(clean.get("model"), clean.get("adapter")))
    return JudgeSpec(name, clean.get("model"), clean.get("adapter"), clean.get("endpoint"), clean.get("key_env"),
                     **settings)


def parse_judge(value: str, option: str = "--judge") -> JudgeSpec:
    """One ``--judge`` value (see the module doc); ``option`` names the flag in the messages (perturb's
    ``--model``)."""
    value = value.strip()
    if not value:
        raise JudgeSpecError(f"{option}: empty value")
    if "=" not in value:
        return make_spec({"model": value}, f"{option} {value!r}")
    fields: dict[str, str] = {}
    for part in value.split(","):
        key, sep, val = part.partition("=")
        if not sep:
            raise JudgeSpecError(f"{option} {value!r}: {part!r} is not key=value")
        if key.strip() in fields:
            raise JudgeSpecError(f"{option} {value!r}: {key.strip()} given twice")
        fields[key.strip()] = val
    return make_spec(fields, f"{option} {value!r}")


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


def weights_identity(model: str, resolve: bool = True) -> str | None:
    """What names a local judge's weights: ``sha256:<weights_fingerprint>`` of a local folder (an alias's folder
    when ``resolve``), ``hub:<commit>`` of a hub id (the commit its branch names now, `judgetrain.run.revisions`;
    ``hub:None`` when neither the hub nor the cache can tell). None where ``resolve`` is off and it would build an
    alias or ask the hub."""
    if Path(model).expanduser().is_dir():
        return "sha256:" + weights_fingerprint(Path(model).expanduser())
    if not resolve:
        return None
    from judgetrain.models.aliases import is_alias, resolve_model
    from judgetrain.utils.hub import is_hub_id

    if is_alias(model):
        return "sha256:" + weights_fingerprint(Path(resolve_model(model)))
    if is_hub_id(model):
        from judgetrain.run.revisions import hub_commit

        return f"hub:{hub_commit(model, None)}"
    return None


def weights_fingerprint(folder: Path) -> str:
    """SHA-256 over a model folder's config and weight index files (whole) and, of each weight file, its name, size
    and `FINGERPRINT_SAMPLES` blocks of 64 KiB spread over it (its header included): a judge retrained or replaced in
    place changes it, and it reads a few MB however large the model is (a full hash of 16 GB would cost every start
    a minute)."""
    h = hashlib.sha256()
    small = sorted(p for p in folder.glob("*.json") if p.is_file())
    weights = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt"))
    for path in small:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for path in weights:
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            for k in range(FINGERPRINT_SAMPLES):
                f.seek(max(0, (size - FINGERPRINT_BLOCK) * k // max(FINGERPRINT_SAMPLES - 1, 1)))
                h.update(f.read(FINGERPRINT_BLOCK))
    return h.hexdigest()


def endpoint_settings(spec: JudgeSpec, opts) -> dict[str, Any]:
    """The `EndpointGenerator` settings of an endpoint judge: its own (judges file, ``--judge``) over the command's
    (``--endpoint_*``, `judgetrain.judge.options.Options`)."""
    return {"timeout_s": spec.timeout_s if spec.timeout_s is not None else opts.endpoint_timeout_s,
            "max_retries": spec.max_retries if spec.max_retries is not None else opts.endpoint_max_retries,
            "wait_budget_s": spec.wait_budget_s if spec.wait_budget_s is not None else opts.endpoint_wait_budget_s,
            "concurrency": opts.concurrency}


def preflight_endpoints(specs: list[JudgeSpec], opts) -> list[JudgeSpec]:
    """Every endpoint judge checked before anything loads: first each key variable and URL (no request), then each
    server's model list (`EndpointGenerator.preflight`: a refused key, an unknown model, a server that does not
    answer). Returns the specs, endpoint judges with ``served_model`` set; JudgeSpecError naming the judge, the URL
    and what the server answered."""
    from judgetrain.judge.endpoint import EndpointError, EndpointGenerator

    gens = {}
    for spec in specs:
        if spec.is_endpoint:
            try:
                gens[spec.name] = EndpointGenerator(spec.endpoint, spec.model, spec.key_env,
                                                    max_new_tokens=opts.max_new_tokens,
                                                    **endpoint_settings(spec, opts))
            except EndpointError as e:
                raise JudgeSpecError(f"judge {spec.name!r}: {e}") from None
    out = []
    for spec in specs:
        if spec.name in gens:
            try:
                served = gens[spec.name].preflight()
            except EndpointError as e:
                raise JudgeSpecError(f"judge {spec.name!r}: {e}") from None
            logger.info("judge %s: endpoint %s serves model %r as %r", spec.name, spec.endpoint, spec.model, served)
            spec = dataclasses.replace(spec, served_model=served)
        out.append(spec)
    return out


# ------------------------------------------------------------------------------------------------ local models
def preflight_local(specs: list[JudgeSpec], option: str = "--judge") -> None:
    """Every local judge's model and adapter can load here (`judgetrain.checks.preflight.model_problem`), checked
    before anything is written: JudgeSpecError naming the judge and the fix, the output folder left as it was."""
    from judgetrain.checks.preflight import model_problem

    for spec in specs:
        if spec.is_endpoint:
            continue
        if spec.adapter and not (Path(spec.adapter) / "adapter_config.json").is_file():
            raise JudgeSpecError(f"judge {spec.name!r}: adapter {spec.adapter}: no adapter_config.json there; give "
                                 "a PEFT adapter folder (a run's output_dir or one of its checkpoint-N folders)")
        problem = model_problem(spec.base_model(), option)
        if problem:
            raise JudgeSpecError(f"judge {spec.name!r}: {problem}")


def load_local(spec: JudgeSpec, *, dtype: str = "auto", trust_remote_code: bool = False, device=None):
    """(model, tokenizer) of a local judge: the base model (alias, hub id or folder), its adapter applied."""
    from transformers import AutoModelForCausalLM

    from judgetrain.models.aliases import resolve_model

    path = resolve_model(spec.base_model())
    import torch

    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto" if dtype == "auto" else getattr(torch, dtype),
                                                 trust_remote_code=trust_remote_code)
    tokenizer = judge_tokenizer(spec, path, trust_remote_code)
    if spec.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, spec.adapter)
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer


def judge_tokenizer(spec: JudgeSpec, path: str, trust_remote_code: bool = False, revision: str | None = None):
    """The judge's tokenizer: its adapter's own when the adapter folder holds one, else the base model's."""
    from judgetrain.models.loading import load_tokenizer

    own = spec.adapter and (Path(spec.adapter) / "tokenizer_config.json").is_file()
    return load_tokenizer(spec.adapter if own else path, trust_remote_code=trust_remote_code,
                          revision=None if own else revision)


def load_files(spec: JudgeSpec, base: str, *, revision: str | None = None, trust_remote_code: bool = False):
    """(tokenizer, config as a dict, path) of a judge whose weights an engine reads from disk: nothing of the
    weights is loaded here (`judgetrain.judge.fit.load_plan`)."""
    from transformers import AutoConfig

    from judgetrain.models.aliases import resolve_model

    path = str(resolve_model(base))
    config = AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    return judge_tokenizer(spec, path, trust_remote_code, revision), config.to_dict(), path
