"""Dataset adapters: every source becomes validated TRL conversational preference rows.

    from judgetrain.data import load_judgebias, load_ideation, load_rmbench, load_mixture, DataValidationError, sample_source
    from judgetrain.data import load_evalbiasbench, load_judgebench, load_pairwise   # pairwise evaluation sources
"""

from .ideation import load_ideation
from .io import sample_source
from .judgebias import load_judgebias
from .mixture import load_mixture
from .pairwise import load_evalbiasbench, load_judgebench, load_pairwise
from .rmbench import load_rmbench
from .validate import DataValidationError

__all__ = ["load_judgebias", "load_ideation", "load_rmbench", "load_mixture", "DataValidationError", "sample_source",
           "load_evalbiasbench", "load_judgebench", "load_pairwise"]
