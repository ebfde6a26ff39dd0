"""What is written to disk and read back: the run state every checkpoint saves whole, checkpoint files (written
atomically, read without pickle), export folders (safetensors and a model card laid out from its family's facts;
ONNX graphs checked through onnxruntime, and a web page that runs them in the browser), a run's folder, and the one
place that decides what a path names.

May import charlm.families and everything below it; never training or the API.
"""
