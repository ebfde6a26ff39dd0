"""The model families, registered in one place: model.arch names one (with data.format, for a decoder of item
lists)."""

from __future__ import annotations

from charlm.config.schema import Config, ModelConfig
from charlm.families.base import Family
from charlm.families.decoder import DecoderFamily
from charlm.families.encoder import EncoderFamily
from charlm.families.encoder_decoder import EncoderDecoderFamily
from charlm.families.lines import LinesFamily
from charlm.models.decoder import Decoder
from charlm.models.encoder import Encoder
from charlm.models.encoder_decoder import EncoderDecoder
from charlm.models.info import ModelInfo

FAMILIES: dict[str, Family] = {f.name: f for f in (DecoderFamily(), EncoderDecoderFamily(), EncoderFamily())}
# A decoder trained on another data format is a family of its own: same module, other batches, scores and uses.
BY_FORMAT: dict[tuple[str, str], Family] = {("decoder", "lines"): LinesFamily()}

AnyModel = Decoder | EncoderDecoder | Encoder


def family(arch: str) -> Family:
    """The family model.arch names (the config has already refused any other name)."""
    return FAMILIES[arch]


def family_for(config: Config) -> Family:
    """The family of a run or a trained model: model.arch's, or the one its data.format makes of it (lines)."""
    return BY_FORMAT.get((config.model.arch, config.data.format)) or FAMILIES[config.model.arch]


def build_model(config: ModelConfig, vocab_size: int) -> AnyModel:
    """A fresh model of config.arch (weights initialised as its class does)."""
    return family(config.arch).build(config, vocab_size)


def model_info(config: ModelConfig, vocab_size: int) -> ModelInfo:
    """Parameters per component and training FLOPs per token of a model of this config."""
    return family(config.arch).info(config, vocab_size)
