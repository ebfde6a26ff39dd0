"""Where a decoder's window begins as its text grows: the one windowing policy of every decoding loop (torch's,
onnxruntime's and the server's engine, row by row).

Windowing policy. Every position sees at most block_size characters: itself and those before it.
- Absolute positions (learned, sinusoidal): when the text no longer fits, the window jumps forward to keep only the
  last block_size // 2 characters, which are re-encoded once; the next block_size // 2 characters are then decoded
  from the cache. A prompt longer than the context is treated the same way.
- Relative positions (RoPE, ALiBi): the window rolls forward one character per step; the cache drops its oldest
  position and nothing is re-encoded. Each position keeps the keys and values it had when it was decoded, so the
  model acts as a sliding-window Transformer over the whole text.
Both loops follow the same policy, so under greedy decoding they produce the same text.
"""

from __future__ import annotations

from charlm.config.schema import ModelConfig
from charlm.models.decoder import Decoder, decoder_reach, relative_positions


def window_start(length: int, start: int, block_size: int) -> int:
    """Where the model's window begins once the text is `length` long (it began at `start`)."""
    if length - start > block_size:
        return length - max(1, block_size // 2)
    return start


class ContextWindow:
    """The windowing policy above for one text: where the model's window begins as the text grows. Used by the
    decoding loops and by the server's engine, row by row."""

    def __init__(self, model: Decoder | ModelConfig):
        """The policy of a model, or of a decoder's config where no torch module runs it (an ONNX export)."""
        config = model if isinstance(model, ModelConfig) else model.config
        self.relative, self.reach = relative_positions(config), decoder_reach(config)
        self.block_size = config.block_size
        self.start = 0

    def advance(self, length: int) -> int:
        """The window's start once the text is `length` long; encode from there to see all the model can."""
        if self.relative:  # rolls: the last `reach` positions are all the next one depends on
            self.start = max(0, length - self.reach)
        else:
            self.start = window_start(length, self.start, self.block_size)
        return self.start

    def jumps(self, length: int) -> bool:
        """Absolute positions: whether the window must jump forward (and be re-encoded) at this length."""
        return not self.relative and window_start(length, self.start, self.block_size) != self.start

    def position(self, start: int) -> int:
        """The position the model gives the window's first character: its place in the text, or 0 for absolute
        positions, which restart with each window."""
        return start if self.relative else 0
