"""The reaches into library internals (judgetrain.compat): each hooked attribute exists in the installed library with
the parameters or kind its patch expects, no library is newer than the version the patches were checked against,
the patches work on the real library objects, and no module outside judgetrain.compat reaches into those internals.

Fast: nothing trains; the largest object built is a one-layer Qwen2 with a 64-token vocabulary.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import importlib.metadata
import inspect
import io
import re
import tokenize
import types
from pathlib import Path

import pytest
import torch

import judgetrain
from judgetrain.compat import CHECKED, HOOKS, Hook

PACKAGE = Path(judgetrain.__file__).resolve().parent
COMPAT = PACKAGE / "compat"


def _installed(library: str) -> str:
    return importlib.metadata.version(library)


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(version).release


def _resolve(path: str):
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module of {path} can be imported")


def _assigns(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a base of it from the same library) assigns ``self.<name>`` in its own code."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=\n]*)?=(?!=)")
    top = cls.__module__.split(".")[0]
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] != top:
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def _problem(hook: Hook) -> str | None:
    """What in the installed library differs from what ``hook``'s patch expects (None: nothing)."""
    owner_path, _, name = hook.path.rpartition(".")
    try:
        if hook.kind in ("instance attribute", "property"):
            owner = _resolve(owner_path)
            if not isinstance(owner, type):
                return f"{owner_path} is no longer a class"
            if hook.kind == "property":
                attr = inspect.getattr_static(owner, name, None)
                if not isinstance(attr, (property, types.GetSetDescriptorType)):
                    return f"{hook.path} is {type(attr).__name__}, not a property"
                return None
            return None if _assigns(owner, name) else f"{owner_path} no longer assigns self.{name}"
        obj = _resolve(hook.path)
    except (ImportError, AttributeError) as e:
        return f"{hook.path} is gone ({type(e).__name__}: {e})"
    if hook.kind == "callable":
        if not callable(obj):
            return f"{hook.path} is no longer callable"
        params = tuple(inspect.signature(obj).parameters)
        if params != hook.expects:
            return f"{hook.path} takes {params}, the patch expects {hook.expects}"
    elif hook.kind == "class" and not isinstance(obj, type):
        return f"{hook.path} is no longer a class"
    elif hook.kind == "mapping" and not isinstance(obj, collections.abc.MutableMapping):
        return f"{hook.path} is {type(obj).__name__}, not a mutable mapping"
    elif hook.kind == "fields":
        if not dataclasses.is_dataclass(obj):
            return f"{hook.path} is no longer a dataclass"
        missing = set(hook.expects) - {f.name for f in dataclasses.fields(obj)}
        if missing:
            return f"{hook.path} has no field(s) {sorted(missing)}"
    return None


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.path)
def test_every_hooked_attribute_is_what_its_patch_expects(hook):
    problem = _problem(hook)
    assert problem is None, (
        f"{problem}. Patch {hook.patch} (checked: {hook.library} {hook.checked}; installed: "
        f"{hook.library} {_installed(hook.library)}) would break: {hook.feature}. Read the library's new code, adapt "
        "the patch in judgetrain/compat/ and its entry in judgetrain.compat.HOOKS."
    )


def test_installed_libraries_are_not_newer_than_the_patches_were_checked_against():
    newer = []
    for library in sorted({h.library for h in HOOKS if h.private}):
        installed = _installed(library)
        stale = [h for h in HOOKS if h.library == library and _release(installed) > _release(h.checked)]
        if stale:
            hooks = "\n".join(f"    {h.path}  ->  {h.patch}  ({h.feature})" for h in stale)
            newer.append(f"{library} {installed} is installed, newer than {library} {stale[0].checked} that "
                         f"judgetrain's patches into its internals were checked against. Re-check each of these "
                         f"against the new release's source (and run the tests of the features named), then raise "
                         f"CHECKED[{library!r}] in judgetrain/compat/__init__.py:\n{hooks}")
    assert not newer, "\n\n".join(newer)


def test_the_version_check_sees_a_newer_release():
    assert _release("1.17.0") > _release("1.16.0") and _release("2.13.0+cpu") == _release(CHECKED["torch"])
    assert not _release("5.24.0") > _release(CHECKED["transformers"])


def test_every_patch_named_in_the_registry_exists():
    missing = []
    for hook in HOOKS:
        module = None
        for part in hook.patch.split(" / "):
            path = part if "." in part else f"{module}.{part}"
            try:
                obj = _resolve(path)
            except (ImportError, AttributeError):
                missing.append(f"{hook.path}: {path}")
                continue
            module = obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__
    assert missing == [], f"HOOKS names patches that do not exist: {missing}"


def test_every_library_with_hooks_has_a_checked_version():
    assert {h.library for h in HOOKS} <= set(CHECKED)
    assert all(_release(h.checked) for h in HOOKS)


# ----------------------------------------------------------------------------------------------- the patches at work


def _tiny_qwen2():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def test_trl_fused_forward_is_bound_on_the_instance_and_wraps_and_unwraps():
    from trl.trainer.utils import FusedCausalLMOutput, add_fused_lm_head

    from judgetrain.compat.trl import forward_is_wrapped, unwrap_fused_forward, wrap_fused_forward

    feature = "prefix sharing in DPO training (judgetrain.compat.trl.wrap_fused_forward)"
    model = _tiny_qwen2()
    add_fused_lm_head(model)
    fused = vars(model).get("forward")
    assert isinstance(fused, types.MethodType), f"add_fused_lm_head no longer binds model.forward: breaks {feature}"
    ids = torch.tensor([[3, 4, 5, 6]])
    labels = torch.tensor([[-100, -100, 5, 6]])
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    assert isinstance(out, FusedCausalLMOutput) and out.log_probs.shape == (1, 3), f"fused head output: {feature}"
    shifted = model(input_ids=ids, shift_labels=labels, fused_lm_head=True)  # the packed forward passes these
    assert shifted.log_probs.shape == (1, 4), f"fused head no longer scores shift_labels unshifted: {feature}"

    calls = []

    def forward(self, *args, **kwargs):
        calls.append(self)
        return inner(*args, **kwargs)

    inner = model.forward
    wrap_fused_forward(model, inner, forward)
    assert forward_is_wrapped(model)
    torch.testing.assert_close(model(input_ids=ids, labels=labels, fused_lm_head=True).log_probs, out.log_probs)
    assert calls == [model]
    unwrap_fused_forward(model)
    assert not forward_is_wrapped(model) and model.forward is fused, f"TRL's forward is not put back: breaks {feature}"


def test_a_datasets_cache_file_lies_beside_its_rows_under_a_fingerprint_kept_across_loads(tmp_path):
    """What the per-machine reference log-probs cache (judgetrain.compat.trl.PerMachineRefLogps) relies on: the file
    is in the loaded dataset's own folder (each machine's rows folder), and a reload of the folder (a resume) has the
    same fingerprint, so the same file name."""
    from datasets import Dataset, load_from_disk

    from judgetrain.compat.datasets import cache_file_beside, dataset_fingerprint

    Dataset.from_dict({"prompt": ["a", "b"]}).save_to_disk(str(tmp_path / "node-1"))
    first, again = load_from_disk(str(tmp_path / "node-1")), load_from_disk(str(tmp_path / "node-1"))
    assert cache_file_beside(first, "f00d") == str(tmp_path / "node-1" / "cache-f00d.arrow")
    assert dataset_fingerprint(first) == dataset_fingerprint(again) and len(dataset_fingerprint(first)) >= 16


def test_without_zero3_init_hides_the_deepspeed_config_and_puts_it_back():
    from transformers.integrations import deepspeed as hf_deepspeed

    from judgetrain.compat.transformers import without_zero3_init

    class Zero3:
        config: dict = {}

        def is_zero3(self):
            return True

    config = Zero3()
    hf_deepspeed.set_hf_deepspeed_config(config)
    try:
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
        with without_zero3_init():
            assert not hf_deepspeed.is_deepspeed_zero3_enabled()
        assert hf_deepspeed.is_deepspeed_zero3_enabled(), "the DeepSpeed config was not put back"
    finally:
        hf_deepspeed.unset_hf_deepspeed_config()


def test_cache_layers_and_entry_selection_on_a_real_dynamic_cache():
    from transformers import Qwen2Config
    from transformers.cache_utils import DynamicCache

    from judgetrain.compat.transformers import non_dynamic_cache_layers, select_cache_entries

    assert non_dynamic_cache_layers(Qwen2Config(num_hidden_layers=2)) == []
    sliding = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert non_dynamic_cache_layers(sliding) == ["DynamicSlidingWindowLayer"]
    keys, values = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    cache = DynamicCache(ddp_cache_data=[(keys, values), (keys + 1, values + 1)])
    picked = select_cache_entries(cache, torch.tensor([1, 1, 0]))
    assert len(picked.layers) == 2 and picked.get_seq_length() == 3
    torch.testing.assert_close(picked.layers[1].keys, (keys + 1)[[1, 1, 0]])
    torch.testing.assert_close(cache.layers[0].values, values)  # the source cache is left as it was


def test_accelerate_distributed_type_is_read_and_presented_through_the_shared_state():
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    from judgetrain.compat.accelerate import present_distributed_type, shared_distributed_type

    state = PartialState(cpu=True)
    before = shared_distributed_type()
    assert before == state.distributed_type
    try:
        present_distributed_type(DistributedType.MULTI_GPU)
        assert PartialState().distributed_type == DistributedType.MULTI_GPU
    finally:
        present_distributed_type(before)
    assert PartialState().distributed_type == before


def test_torch_last_lr_dispatch_mode_and_tensor_map():
    from judgetrain.compat.torch import each_tensor, set_last_lr, tensor_dispatch_mode

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    set_last_lr(scheduler, [0.5])
    assert scheduler.get_last_lr() == [0.5]

    seen = []

    class Count(tensor_dispatch_mode()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            each_tensor(lambda t: seen.append(tuple(t.shape)), out)
            return out

    with Count():
        torch.ones(2, 3).sum(0)
    assert (3,) in seen


def test_wandb_callback_holds_its_module_and_no_run_means_none():
    from transformers.integrations import WandbCallback

    from judgetrain.compat.transformers import active_wandb

    callback = WandbCallback()
    assert "_wandb" in vars(callback), "WandbCallback no longer keeps the wandb module as _wandb"
    assert active_wandb(callback) is None  # no run started on this process
    assert active_wandb(object()) is None


def test_log_without_overrides_skips_the_dpo_trainer_metrics_merge(tmp_path):
    """A real DPOTrainer's log state (no model loaded): Trainer.log records the eval metrics alone and leaves TRL's
    pending train metrics for the next train record; DPOTrainer.log would merge them in."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback
    from trl import DPOTrainer

    from judgetrain.compat.transformers import log_without_overrides

    trainer = DPOTrainer.__new__(DPOTrainer)
    trainer.args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    trainer.state, trainer.control = TrainerState(), TrainerControl()
    trainer.callback_handler = CallbackHandler([DefaultFlowCallback()], None, None, None, None)
    trainer.model = torch.nn.Linear(1, 1)
    trainer._metrics = {"train": {"rewards/chosen": [1.0]}, "eval": {}}
    log_without_overrides(trainer, {"eval_rmbench/accuracy": 0.5})
    logged = trainer.state.log_history[-1]
    assert logged["eval_rmbench/accuracy"] == 0.5 and "rewards/chosen" not in logged, (
        "transformers.Trainer.log changed: the eval callback's log event (judgetrain.compat.transformers."
        "log_without_overrides) no longer holds only its metrics")
    assert trainer._metrics["train"] == {"rewards/chosen": [1.0]}
    DPOTrainer.log(trainer, {"eval_x": 1.0})  # what the skip avoids: TRL merges and clears its train metrics
    assert "rewards/chosen" in trainer.state.log_history[-1] and trainer._metrics["train"] == {}

    class Logged:
        def __init__(self):
            self.logs = []

        def log(self, logs):
            self.logs.append(logs)

    other = Logged()
    log_without_overrides(other, {"eval_x": 1.0})
    assert other.logs == [{"eval_x": 1.0}]


# ----------------------------------------------------------------------------------------------- the source scan

REACHES = {
    r"\b_shared_state\b": "accelerate's PartialState state",
    r"\b_get_grad_norm\b": "Trainer's grad norm",
    r"\b_get_control_tokens\b": "a tokenizer's control tokens",
    r"\b_hf_deepspeed_config_weak_ref\b": "transformers' DeepSpeed config",
    r"\b_last_lr\b": "an LR scheduler's last rates",
    r"\b_wandb\b": "WandbCallback's wandb module",
    r"\b_python_dispatch\b": "torch's dispatch modes",
    r"\b_pytree\b": "torch's pytree",
    r"\btorch\.utils\._": "a private torch module",
    r"__wrapped__": "a wrapped forward",
    r"__func__": "a bound method's function",
    r"\brewrite_logs\b": "transformers' log key rewriting",
    r"\bintegration_utils\b": "transformers' integration internals",
    r"\bintegrations\s+import\s+deepspeed\b": "transformers' DeepSpeed integration",
    r"\bTrainer\.log\(": "Trainer.log past a subclass override",
    r"\b_compute_loss\b": "DPOTrainer's private loss",
    r"\b_precompute_ref_logps\b": "DPOTrainer's private precompute",
    r"\b_is_vision_dataset\b": "DPOTrainer's vision flag",
    r"\b_precompute_(model_hash|engine)\b": "DPOTrainer's precompute state",
    r"\._fingerprint\b": "a dataset's fingerprint",
    r"\b_get_cache_file_path\b": "a dataset's cache file path",
    r"\b_attn_implementation\b": "a config's attention implementation",
    r"\bddp_cache_data\b": "DynamicCache's layer data",
    r"(?i:cache)\w*(\([^()]*\))?\.layers\b": "a cache's layers",
    r"\blayer\.(keys|values)\b": "a cache layer's tensors",
    r"\bpeft\.tuners\.lora\.layer\b": "PEFT's LoRA layer module",
    r"\.forward\s*=(?!=)": "a forward patched on an instance",
    r"\bdel\s+[\w.]+\.forward\b": "a forward patched on an instance",
    r"\.training_step\s*=(?!=)": "a training_step patched on an instance",
}
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.]*")


def _code_lines(source: str) -> list[str]:
    """The source with comments and prose strings blanked (positions kept); a string that is a bare name (what
    ``getattr(obj, "_name")`` reaches with) stays."""
    lines = source.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            try:
                value = eval(tok.string, {})  # noqa: S307 - a literal token of our own source
            except Exception:  # noqa: BLE001 - an f-string: prose
                value = None
            if isinstance(value, str) and _IDENTIFIER.fullmatch(value):
                continue
        elif tok.type != tokenize.COMMENT:
            continue
        (r0, c0), (r1, c1) = tok.start, tok.end
        for r in range(r0, r1 + 1):
            line = lines[r - 1]
            start = c0 if r == r0 else 0
            end = c1 if r == r1 else len(line.rstrip("\n"))
            lines[r - 1] = line[:start] + " " * (end - start) + line[end:]
    return lines


def _reaches(source: str) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(_code_lines(source), 1):
        for pattern, what in REACHES.items():
            if re.search(pattern, line):
                found.append((number, what))
    return found


def test_the_source_scan_finds_a_reach_and_ignores_prose():
    assert _reaches("from accelerate import PartialState\nPartialState._shared_state['x'] = 1\n") == [
        (2, "accelerate's PartialState state")]
    assert _reaches("wandb = getattr(cb, '_wandb', None)\n") == [(1, "WandbCallback's wandb module")]
    assert _reaches("x = DynamicCache(config=c).layers\nmodule.forward = f\n") == [
        (1, "a cache's layers"), (2, "a forward patched on an instance")]
    prose = '"""transformers applies rewrite_logs; Trainer.log(self, x)"""\n# cb._wandb\nlr = s.get_last_lr()\n'
    assert _reaches(prose) == []
    assert _reaches("def _finish_wandb(trainer):\n    return trainer.compute_loss\n") == []


def test_no_module_outside_compat_reaches_into_library_internals():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if COMPAT in path.parents:
            continue
        for number, what in _reaches(path.read_text()):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {what}")
    assert found == [], ("reaches into library internals outside judgetrain/compat/ (move each into a named function "
                         "there, with its docstring and a judgetrain.compat.HOOKS entry):\n" + "\n".join(found))
