"""The names inside a sweep folder, in a module without torch, so that `charlm plot` can tell a sweep folder quickly.

The folder holds `study.db` (the Optuna study, there from the sweep's start), `sweep.lock` (held with flock while a
sweep runs), `trial-NNN/` run folders, `results.json` (rewritten after every trial, marked with KIND) and `best.yaml`
(the best trial's config, for `charlm train --config`).
"""

STUDY_FILE, LOCK_FILE, RESULTS_FILE, BEST_FILE = "study.db", "sweep.lock", "results.json", "best.yaml"
STUDY_NAME = "charlm-sweep"  # the study's name inside study.db
KIND = "charlm-sweep"  # results.json's "kind": how `charlm plot` knows a sweep folder from a run folder
