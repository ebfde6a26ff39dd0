"""charlm: train, measure and sample character-level Transformer language models."""

__version__ = "0.1.0"
