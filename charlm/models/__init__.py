"""The three Transformer families and the one core they are built from: shared layers (feed-forward, norms,
positions, token shift), one attention (causal, both ways, cross), one residual block, the ends every family shares
(embeddings, output head, length check, loss), the Linear layer whose CPU kernels can be chosen, the caches decoding
keeps behind one interface; then the decoder (GPT), the encoder-decoder and the encoder, int8 quantisation and
parameter counts (which class model.arch builds is charlm.families' to say).

May import charlm.data, charlm.hardware, charlm.config and the base modules; never decoding, training or storage.
"""
