"""The package's version, in a module of its own so that storage code can record it without importing the package
root."""

__version__ = "0.1.0"
