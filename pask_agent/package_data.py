"""Where the data pask-agent ships lives, in a checkout and in an installed wheel alike.

Why one helper: the policy tables, traces and splits stay in the top-level ``calibration_data/``
folder and the text-to-SQL samples in ``recipes/data/``, where people and issues expect them,
while a wheel must carry them inside the package. ``setup.py`` maps the two folders onto the
subpackages ``pask_agent.calibration_data`` and ``pask_agent.sample_data``, so
``importlib.resources`` finds them in both an editable install (the folders themselves) and a
wheel (copies under ``site-packages/pask_agent/``). Every reader goes through this module and
never through ``Path(__file__).parents[...]``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pask_agent.errors import ConfigError

CALIBRATION_PACKAGE = "pask_agent.calibration_data"
SAMPLE_PACKAGE = "pask_agent.sample_data"


def _package_dir(package: str, folder: str) -> Path:
    try:
        root = resources.files(package)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{package} is not installed, so {folder}/ cannot be found; reinstall pask-agent "
            "(`pip install -e .` in a checkout: the mapping of the data folders is in setup.py)"
        ) from exc
    # Wheels and editable installs are unpacked on disk, so the traversable is a real folder.
    return Path(str(root))


def calibration_data_dir() -> Path:
    """``calibration_data/``: policy tables (``policies/``), splits and traces."""
    return _package_dir(CALIBRATION_PACKAGE, "calibration_data")


def sample_data_dir() -> Path:
    """``recipes/data/``: the sample SQLite databases and ``questions.jsonl``."""
    return _package_dir(SAMPLE_PACKAGE, "recipes/data")


def policy_table_path(name: str = "default") -> Path:
    """The shipped table ``calibration_data/policies/<name>.json`` (it may not exist yet)."""
    return calibration_data_dir() / "policies" / f"{name}.json"
