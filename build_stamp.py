"""Build step (pyproject's ``[tool.setuptools.cmdclass]``): stamp the commit being built into the package.

``build_py`` writes ``rocm_vit/_build.py`` (``COMMIT = "<sha>[-dirty]"``) into the build, so a wheel
names its commit wherever it is installed; ``sdist`` writes it into the source archive, so the wheel
built from that archive (``python -m build`` builds one from the other, with no git) keeps it. The
commit comes from rocm_vit/version.py's rule, which asks git only when this folder is the repository's
root, and is ``"unknown"`` otherwise. An editable install is not stamped: it runs the checkout itself,
where rocm_vit/version.py asks git at run time. This file is not part of the wheel.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
STAMP = Path("rocm_vit", "_build.py")


class BuildPy(build_py):
    """``build_py`` that adds ``rocm_vit/_build.py`` to the build."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        commit = _source_commit()
        if commit is None and (ROOT / STAMP).is_file():
            return  # built from an sdist: the stamp it carries has been copied with the modules
        _write_stamp(Path(self.build_lib) / STAMP, commit or "unknown")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        stamp = str(Path(self.build_lib) / STAMP)
        return outputs if self.editable_mode or stamp in outputs else [*outputs, stamp]


class Sdist(sdist):
    """``sdist`` whose archive carries ``rocm_vit/_build.py`` for the wheel built from it."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        commit = _source_commit()
        if commit is None:
            return
        target = Path(base_dir) / STAMP
        # The release tree hard-links the checkout's files: never write through a link to one.
        target.unlink(missing_ok=True)
        _write_stamp(target, commit)


def _source_commit() -> str | None:
    """The commit of the tree being built, by rocm_vit/version.py's rule (loaded by path: nothing is
    installed yet, and importing the package would import more than the standard library)."""
    spec = importlib.util.spec_from_file_location("_rocm_vit_version", ROOT / "rocm_vit" / "version.py")
    version = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version)
    return version.checkout_commit(ROOT)


def _write_stamp(path: Path, commit: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'"""Written by build_stamp.py when this rocm-vit was built: the commit built."""\n\n'
        f"COMMIT = {json.dumps(commit)}\n"
    )
