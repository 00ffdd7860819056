"""Build hook: a wheel (or a non-editable install) carries the top-level ``recipes/`` and ``accelerate_configs/``
inside the package, as ``judgetrain/recipes/*.yaml`` and ``judgetrain/accelerate_configs/*.yaml``, so that
``judgetrain train quickstart --accelerate_config cpu`` works after ``pip install`` from any folder. The repository
keeps one copy of them, at the top level, where the README names them; an editable install ships nothing extra and
``judgetrain.config.packaged`` finds them there. Everything else is declared in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("recipes", "accelerate_configs")  # top-level folder -> judgetrain/<folder>/ in the wheel


class build_py_with_recipes(build_py):
    def _shipped(self) -> list[tuple[Path, Path]]:
        return [(src, Path(self.build_lib) / "judgetrain" / kind / src.name)
                for kind in SHIPPED for src in sorted((ROOT / kind).glob("*.yaml"))]

    def run(self):
        super().run()
        if self.editable_mode:  # the source tree is imported as it is: nothing to copy
            return
        for kind in SHIPPED:  # a file removed from the top-level folder must not linger from an earlier build
            shutil.rmtree(Path(self.build_lib) / "judgetrain" / kind, ignore_errors=True)
        for src, target in self._shipped():
            self.mkpath(str(target.parent))
            self.copy_file(str(src), str(target), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        shipped = [] if self.editable_mode else [str(target) for _, target in self._shipped()]
        return super().get_outputs(include_bytecode) + shipped


setup(cmdclass={"build_py": build_py_with_recipes})
