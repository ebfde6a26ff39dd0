"""The Python API that `import charlm` offers: charlm.train, charlm.load and the Model they return (generate,
sample, evaluate, transduce, fill, attention, export), each checking its arguments with the same one-line errors as
the command line.

charlm.load, charlm.export and charlm.train are in entry, the Model in model, an ONNX export's Model in onnx_model.

May import charlm.training and everything below it; the server and the CLI are built on it.
"""
