"""Which model class a config builds: the one place that maps model.arch to a module."""

from __future__ import annotations

from charlm.config.schema import ModelConfig
from charlm.models.decoder import GPT
from charlm.models.encoder import EncoderOnly
from charlm.models.encoder_decoder import EncoderDecoder

AnyModel = GPT | EncoderDecoder | EncoderOnly


def build_model(config: ModelConfig, vocab_size: int) -> AnyModel:
    """A fresh model of config.arch (weights initialised as its class does)."""
    if config.arch == "encoder-decoder":
        return EncoderDecoder(config, vocab_size)
    if config.arch == "encoder":
        return EncoderOnly(config, vocab_size)
    return GPT(config, vocab_size)
