"""What is written to disk and read back: the run state every checkpoint saves whole, checkpoint files (written
atomically, read without pickle), export folders (safetensors and a model card; ONNX graphs checked through
onnxruntime, and a web page that runs them in the browser), a run's folder, and the one place that decides what a
path names.

May import charlm.decoding, charlm.evaluation, charlm.models and everything below them; never training or the API.
"""
