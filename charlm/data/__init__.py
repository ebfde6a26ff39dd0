"""From files to token ids: tokenizers, corpora read and split into windows, the flat memory-mapped token files of
large corpora (prepare), paired source/target data with its special ids, an encoder's windows with characters
hidden (masking), and the built-in corpora's downloads.

May import charlm.config, charlm.hardware and the base modules; never a model.
"""
