"""Scoring a model on token ids: the deterministic full pass over a split and the cheap fixed-window estimate used
while training, each returning an EvalResult (loss, bits per character, what was scored); an encoder's score on
hidden characters (masked).

May import charlm.models and everything below it; a peer of charlm.decoding (neither imports the other).
"""
