"""An ONNX export's graphs in onnxruntime sessions, answering in torch tensors: the decoder's step, the
encoder-decoder's encoder and target step, the encoder's logits (the names and state layout are
charlm/models/onnx_graphs.py's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from charlm.config.schema import ModelConfig
from charlm.data.corpus import IGNORE
from charlm.errors import UsageError
from charlm.models.onnx_graphs import EMPTY

ONNX_HINT = 'pip install -e ".[onnx]" in your charlm checkout (or pip install onnx onnxruntime onnxscript)'


def onnxruntime() -> Any:
    """The onnxruntime module, or one line saying how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise UsageError(f"running an ONNX export needs onnxruntime: {ONNX_HINT}") from None
    return onnxruntime


class OnnxRuntime:
    """The sessions of one export (graph name -> file), on onnxruntime's CPU provider; state stays in onnxruntime's
    arrays between steps, and logits come back as torch tensors for charlm's own sampler and losses."""

    def __init__(self, files: dict[str, Path], config: ModelConfig, threads: int = 0):
        ort = onnxruntime()
        options = ort.SessionOptions()
        options.log_severity_level = 3  # warnings about unused initializers would break the one-line promise
        if threads:
            options.intra_op_num_threads = threads
        # Idle threads sleep instead of spinning for the next run: spinning took the cores from everything else in
        # the process (the sampler, torch) and on the machine between steps.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.config = config
        self.sessions = {}
        for name, path in files.items():
            try:
                self.sessions[name] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            except Exception as e:  # onnxruntime raises its own error types for damaged or missing files
                first = (str(e).strip().splitlines() or [""])[0][:160]
                raise UsageError(f"cannot load the ONNX graph {path}: {first}") from None
        self.names = {name: [i.name for i in s.get_inputs()] for name, s in self.sessions.items()}

    def _run(self, graph: str, values: list[Any]) -> list[Any]:
        return self.sessions[graph].run(None, dict(zip(self.names[graph], values, strict=True)))

    def empty_state(self, batch: int) -> list[Any]:
        """A fresh text's state (models/onnx_graphs.empty_state, as arrays)."""
        c = self.config
        shape = (c.n_layer, batch, c.n_head, c.block_size, c.n_embd // c.n_head)
        state = [torch.zeros(shape).numpy(), torch.zeros(shape).numpy()]
        state.append(torch.full((c.block_size,), EMPTY, dtype=torch.long).numpy())
        if c.token_shift:
            state.append(torch.zeros(c.n_layer + 1, batch, c.n_embd).numpy())
        return state

    def step(self, ids: torch.Tensor, start: int, state: Any) -> tuple[torch.Tensor, Any]:
        """The decoder: logits (B, T, V) of ids (B, T) from position `start`, and the next state (None: fresh)."""
        state = self.empty_state(ids.size(0)) if state is None else state
        out = self._run("model", [ids.contiguous().numpy(), _start(start), *state])
        return torch.from_numpy(out[0]), out[1:]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of whole windows: the decoder from a fresh state, or the encoder's one graph."""
        if "ids" in self.names["model"] and "start" not in self.names["model"]:
            return torch.from_numpy(self._run("model", [ids.contiguous().numpy()])[0])
        return self.step(ids, 0, None)[0]

    def encode(self, src: torch.Tensor) -> list[Any]:
        """The encoder-decoder's encoder: its memory (cross-attention keys, values, mask) of padded sources (B, S)."""
        return self._run("encoder", [src.contiguous().numpy()])

    def target_step(self, tgt: torch.Tensor, start: int, state: Any, memory: list[Any]) -> tuple[torch.Tensor, Any]:
        """The encoder-decoder's decoder: logits (B, T, V) of target ids (B, T) from `start`, and the next state."""
        state = self.empty_state(tgt.size(0)) if state is None else state
        out = self._run("decoder", [tgt.contiguous().numpy(), _start(start), *state[:3], *memory, *state[3:]])
        return torch.from_numpy(out[0]), out[1:]


def _start(position: int) -> Any:
    return torch.tensor([position], dtype=torch.long).numpy()


class OnnxForward(nn.Module):
    """An export's whole-window graph as a module charlm's scoring calls like its own models (full passes, hidden
    characters, blanks): forward(ids, targets) -> (logits, mean cross-entropy), computed by onnxruntime."""

    def __init__(self, runtime: OnnxRuntime, config: ModelConfig, vocab_size: int):
        super().__init__()
        self.runtime, self.config, self.vocab_size, self.mask_id = runtime, config, vocab_size, vocab_size
        # No weights here (they are in the graphs): an empty parameter tells code that asks where the model lives
        # the CPU, where onnxruntime's provider runs.
        self.anchor = nn.Parameter(torch.zeros(0), requires_grad=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        logits = self.runtime.forward(ids.cpu())
        if targets is None:
            return logits, None
        flat = logits.float().view(-1, logits.size(-1))
        return logits, F.cross_entropy(flat, targets.cpu().reshape(-1), ignore_index=IGNORE)
