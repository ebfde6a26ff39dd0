"""charlm: train, measure and sample character-level Transformer language models."""

import warnings

__version__ = "0.1.0"

# torch warns at import when NumPy is missing; charlm never uses NumPy, so that line is only noise for users
# (and would break the one-line-error promise of the CLI).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
