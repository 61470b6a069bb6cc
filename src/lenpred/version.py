"""The package version (also in ``pyproject.toml``), recorded in every saved predictor."""

__version__ = "0.2.0"
