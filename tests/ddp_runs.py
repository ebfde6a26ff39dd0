"""Several trainings in one torchrun launch, for tests/test_ddp.py: each rank joins the process group once and runs
them in turn through the run object `charlm train` uses, so that nine trainings (five one-step comparisons, a run
stopped and resumed, one straight through, and `charlm train` itself) pay for one launch's start-up (three
interpreters importing torch).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/ddp_runs.py RUNS.json

RUNS.json: a list of {"config": NAME, "sets": ["key=value", ...], "data": PATH, "out": FOLDER, "steps": N}, in
order; with "resume": true a run goes on in its folder as `charlm train --resume` does (config and data: null). The
last may be {"cli": [ARG, ...]}: `charlm ARG...` through the console script's entry point, whose output is the
launch's and whose exit (under torchrun it leaves at once, as `charlm train` does) ends each rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec: Path) -> None:
    import torch.distributed as dist

    from charlm.training.run import resolve_run

    dist.init_process_group("gloo")  # each run finds it joined, uses it, and leaves it to this script

    for run in json.loads(spec.read_text(encoding="utf-8")):
        if "cli" in run:
            from charlm.cli.app import main as charlm

            charlm(run["cli"])  # exits
            raise SystemExit("charlm returned instead of leaving the process: the runs after it did not run")
        options = {"train.max_steps": ("--max-steps", run["steps"])}
        if run["data"] is not None:
            options["data.path"] = ("--data", run["data"])
        resume = bool(run.get("resume"))
        resolve_run(run["config"], run["sets"], options, run["out"], resume=resume).run(quiet=True)
        if not dist.is_initialized():
            raise SystemExit(f"the run into {run['out']} ended the process group it did not create")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as `charlm train` leaves under torchrun: gloo's threads can abort an interpreter's shutdown


if __name__ == "__main__":
    main(Path(sys.argv[1]))
