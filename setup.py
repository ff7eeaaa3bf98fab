"""The one packaging fact pyproject.toml cannot state: two top-level folders ship in the package.

``calibration_data/`` (policy tables, splits, traces) and ``recipes/data/`` (the sample SQLite
databases) stay where people and issues name them, and are mapped onto the subpackages
``pask_agent.calibration_data`` and ``pask_agent.sample_data``. A wheel then carries them as
package data, and an editable install resolves the same names to the folders themselves, so
``pask_agent.package_data`` reads both through ``importlib.resources``. Everything else is in
pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

DATA_PACKAGES = {
    "pask_agent.calibration_data": "calibration_data",
    "pask_agent.sample_data": "recipes/data",
}


def data_tree(package: str, folder: str) -> list[str]:
    """The package and one entry per subfolder: setuptools ships only listed folders' files."""
    subfolders = find_namespace_packages(where=folder, exclude=["*__pycache__*"])
    return [package, *(f"{package}.{sub}" for sub in subfolders)]


setup(
    packages=[
        *find_packages(include=["pask_agent", "pask_agent.*"]),
        *(name for package, folder in DATA_PACKAGES.items() for name in data_tree(package, folder)),
    ],
    package_dir=DATA_PACKAGES,
)
