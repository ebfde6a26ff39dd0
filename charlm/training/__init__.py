"""A training run: the recipe that owns setup, the loop and cleanup (run) with what it is built from (run_parts), the
loop itself (loop) and its step (step), the run's set-up (setup), optimizers, the learning-rate schedule, where the
figures go (metrics) and fine-tuning from another model's weights; the recipe for a time budget (budget) and sweeps of
many runs (sweep_spec, sweep, and the names in a sweep folder: sweep_folder).

May import charlm.storage and everything below it; never the API, the server or the CLI.
"""
