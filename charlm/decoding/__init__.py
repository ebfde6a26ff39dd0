"""Producing text from a trained model: choosing the next character (sampling), the cached decoding loop with stop
strings and streaming (generate), the compiled fixed-shape step (compiled), and the encoder-decoder's batched
greedy decoding and beam search with transduction's error rates (transduce); an encoder's blanks filled (fill);
the same loops through a step that hands its state back as tensors, an ONNX export's (stepped).

May import charlm.models and everything below it; a peer of charlm.evaluation (neither imports the other).
"""
