"""The three model families — decoder, encoder-decoder, encoder — each one object that says how to build its model,
make its batches, score a split, use a trained model (continue text, rewrite sources, fill blanks) and say what
its export's card tells (charlm.storage.model_card lays it out); registered in one place (registry), so that the
trainer, scoring, the API, exports and the command line call through a family and never ask which one they hold.

May import charlm.evaluation, charlm.decoding, charlm.models and everything below them; never storage, training,
the API, the server or the CLI.
"""
