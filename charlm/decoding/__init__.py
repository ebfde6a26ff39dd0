"""Producing text from a trained model: choosing the next character (sampling), the decoding loop with stop strings
and streaming (generate), the compiled fixed-shape step (compiled), the encoder-decoder's batched greedy decoding and
beam search (rewrite), an encoder's blanks filled (fill); each loop written once over the steps a torch module or an
ONNX export's graphs take (steps).

May import charlm.models and everything below it; a peer of charlm.evaluation (neither imports the other).
"""
