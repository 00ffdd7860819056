"""The metric API by its public name: ``judgetrain.metrics.rmbench_accuracy`` and the rest live in
judgetrain.eval.metrics (pure numpy, no torch); this module is that one, under the short name users import."""

from judgetrain.eval.metrics import *  # noqa: F401,F403
from judgetrain.eval.metrics import __all__  # noqa: F401
