"""charlm: train, measure and sample character-level Transformer language models.

From Python (docs/python-api.md):

    import charlm
    summary = charlm.train("tiny", overrides={"train.max_steps": 200}, out_dir="runs/tiny")
    model = charlm.load("runs/tiny")              # a run folder or a checkpoint file
    print(model.generate("JULIET:", max_new_tokens=80, seed=1))
    print(model.evaluate().bpc)                   # bits per character on the validation split
"""

import warnings
from typing import TYPE_CHECKING, Any

from charlm.errors import CharlmError, Interrupted, UsageError, WorkError
from charlm.version import __version__

__all__ = ["CharlmError", "Interrupted", "Model", "UsageError", "WorkError", "__version__", "export", "load", "train"]

# torch warns at import when NumPy is missing; charlm never uses NumPy, so that line is only noise for users
# (and would break the one-line-error promise of the CLI).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

if TYPE_CHECKING:
    from charlm.api.entry import export, load, train
    from charlm.api.model import Model


def __getattr__(name: str) -> Any:
    # The API needs torch; importing it lazily keeps `import charlm` (and so `charlm --help`) fast.
    if name == "Model":
        from charlm.api.model import Model

        return Model
    if name in ("export", "load", "train"):
        from charlm.api import entry

        return getattr(entry, name)
    raise AttributeError(f"module 'charlm' has no attribute {name!r}")
