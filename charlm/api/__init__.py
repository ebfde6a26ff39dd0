"""The Python API that `import charlm` offers: charlm.train, charlm.load and the Model they return (generate,
sample, evaluate, transduce, fill, attention, export), each checking its arguments with the same one-line errors as
the command line.

May import charlm.training and everything below it; the server and the CLI are built on it.
"""

from charlm.api import onnx_model  # noqa: F401  (registers ONNX export folders with charlm.load and export)
