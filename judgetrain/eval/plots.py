"""RM-Bench heatmaps drawn with matplotlib, for the report and for live logging from training.

Training imports this module (`log_matrix_images`) without the report CLI; matplotlib is imported only when a
figure is drawn, so importing it costs nothing.
"""

# Late imports: matplotlib, judgetrain.compat (inside the functions that draw or log a figure): the report and the
# training log import this module, and only a figure needs them.

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

DPI = 100
CURVE_PANEL = (4.0, 3.0)  # inches per curve panel: 400 x 300 px at DPI
MATRIX_PANEL = (4.0, 4.0)  # inches per heatmap panel: 400 x 400 px
MAX_COLS = 4
STYLE_TICKS = ("concise", "detailed\nplain", "detailed\nmarkdown")


def _levels(matrix: np.ndarray) -> tuple[float, float, float]:
    m = np.asarray(matrix, dtype=float)
    hard, easy = m[np.triu_indices(3, 1)], m[np.tril_indices(3, -1)]
    return float(np.mean(hard)), float(np.mean(np.diag(m))), float(np.mean(easy))


def figure_grid(n_panels: int, panel: tuple[float, float] = CURVE_PANEL, max_cols: int = MAX_COLS):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend, Agg when saving

    ncols = min(n_panels, max_cols)
    nrows = math.ceil(n_panels / ncols)
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n_panels:]:
        fig.delaxes(ax)
    return fig, axes[:n_panels]


def _draw_matrix(ax, matrix: Any, title: str) -> None:
    m = np.asarray(matrix, dtype=float)
    ax.imshow(np.nan_to_num(m, nan=0.5), vmin=0.0, vmax=1.0, cmap="RdYlGn")
    for i in range(3):
        for j in range(3):
            level = "normal" if i == j else ("hard" if j > i else "easy")
            v = m[i, j]
            color = "white" if (math.isfinite(v) and (v < 0.15 or v > 0.85)) else "black"
            ax.text(j, i - 0.08, "n/a" if not math.isfinite(v) else f"{v:.2f}", ha="center", va="center",
                    fontsize=13, fontweight="bold", color=color)
            ax.text(j, i + 0.3, level, ha="center", va="center", fontsize=7, color=color, style="italic")
    # the diagonal (normal) boxed; hard above it, easy below it
    from matplotlib.patches import Rectangle

    for i in range(3):
        ax.add_patch(Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, lw=1.5, ls="--", ec="black"))
    ax.set_xticks(range(3), STYLE_TICKS, fontsize=8)
    ax.set_yticks(range(3), STYLE_TICKS, fontsize=8)
    ax.set_xlabel("rejected style", fontsize=9)
    ax.set_ylabel("chosen style", fontsize=9)
    hard, normal, easy = _levels(m)
    ax.set_title(f"{title}\nhard {hard:.2f} · normal {normal:.2f} · easy {easy:.2f}", fontsize=10)


def matrix_figure(matrix: Any, title: str = "RM-Bench"):
    """One RM-Bench 3x3 accuracy heatmap (rows chosen style, columns rejected style) as a matplotlib Figure."""
    fig, (ax,) = figure_grid(1, MATRIX_PANEL)
    _draw_matrix(ax, matrix, title)
    return fig


def matrices_figure(matrices: Mapping[str, Any], title: str):
    fig, axes = figure_grid(len(matrices), MATRIX_PANEL)
    for ax, (name, m) in zip(axes, matrices.items()):
        _draw_matrix(ax, m, name)
    fig.suptitle(title, fontsize=11)
    return fig


# ------------------------------------------------------------------------------------- live logging (training)
def _callbacks_of(obj: Any) -> list[Any]:
    if hasattr(obj, "callback_handler"):
        obj = obj.callback_handler
    if hasattr(obj, "callbacks"):
        obj = obj.callbacks
    return list(obj) if isinstance(obj, Iterable) else [obj]


def _is_a(obj: Any, class_name: str) -> bool:
    return any(cls.__name__ == class_name for cls in type(obj).__mro__)


def figure_to_array(fig) -> np.ndarray:
    """RGB uint8 (H, W, 3) pixels of a matplotlib Figure, rendered with Agg."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def log_matrix_images(trainer_or_callbacks: Any, matrices: Mapping[str, Any], step: int,
                      prefix: str = "eval/rmbench", title: str = "RM-Bench") -> list[str]:
    """Log style heatmaps (RM-Bench's) as images to the active W&B / TensorBoard callbacks of a Trainer.

    ``trainer_or_callbacks``: a Trainer, its ``callback_handler`` or a list of callbacks. ``matrices``:
    {"overall" | <domain>: 3x3} (see `rmbench_matrices`). Tags: ``eval/rmbench/matrix`` and
    ``eval/rmbench/<domain>/matrix`` (``prefix``: the suite's keys; ``title``: its name on each image). Only backends
    set up on this process are used (transformers sets them up on the main process only); nothing is rendered when
    none is. Returns the backends logged to.
    """
    from judgetrain.compat.transformers import active_wandb

    callbacks = _callbacks_of(trainer_or_callbacks)
    wandb_cbs = [cb for cb in callbacks if _is_a(cb, "WandbCallback") and active_wandb(cb) is not None]
    tb_cbs = [cb for cb in callbacks if _is_a(cb, "TensorBoardCallback") and getattr(cb, "tb_writer", None)]
    if not (wandb_cbs or tb_cbs):
        return []
    images = {}
    for name, matrix in matrices.items():
        tag = f"{prefix}/matrix" if name == "overall" else f"{prefix}/{name}/matrix"
        images[tag] = figure_to_array(matrix_figure(matrix, f"{title} {name}, step {step}"))
    logged = []
    for cb in wandb_cbs:
        wandb = active_wandb(cb)
        # the same x axis as WandbCallback.on_log (define_metric step_metric="train/global_step")
        wandb.log({**{tag: wandb.Image(arr, caption=tag) for tag, arr in images.items()},
                   "train/global_step": step})
        logged.append("wandb")
    for cb in tb_cbs:
        for tag, arr in images.items():
            cb.tb_writer.add_image(tag, arr, global_step=step, dataformats="HWC")
        cb.tb_writer.flush()
        logged.append("tensorboard")
    return logged
