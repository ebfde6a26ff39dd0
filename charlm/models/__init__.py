"""The three Transformer families and their parts: shared layers (attention, feed-forward, norms, positions, token
shift), the Linear layer whose CPU kernels can be chosen, the caches decoding keeps, the decoder (GPT), the
encoder-decoder and the encoder, int8 quantisation and parameter counts (which class model.arch builds is
charlm.families' to say).

May import charlm.data, charlm.hardware, charlm.config and the base modules; never decoding, training or storage.
"""
