"""Reaches into PEFT's layers (see `judgetrain.compat`; checked: peft 0.21.2)."""

# Late imports: peft (inside the functions that use them): each hook imports the library it reaches into when it is
# installed or called, so a moved private name fails there, named.

from __future__ import annotations

from typing import Any, Callable


def lora_linear_type() -> type | None:
    """PEFT's LoRA layer around an ``nn.Linear`` (``peft.tuners.lora.layer.Linear``), or None without PEFT.

    checked: peft 0.21.2. A release that moves the class gives None here: every layer keeps PEFT's own forward
    (scores unchanged, only slower)."""
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:
        return None
    return Linear


def shadow_forward(module: Any, forward: Callable[..., Any]) -> None:
    """Run ``forward`` instead of the layer's own ``forward`` on this instance only: an instance attribute in front of
    ``LoraLinear.forward``, which ``nn.Module.__call__`` reaches through ``self.forward``. Undo with
    `restore_forward`.

    checked: peft 0.21.2 (torch 2.13.0). A release whose layers are called through something other than
    ``self.forward`` leaves the shadow unused: scores stay PEFT's own (only slower)."""
    module.forward = forward


def restore_forward(module: Any) -> None:
    """Remove the instance ``forward`` `shadow_forward` set: the class's forward runs again."""
    del module.forward
