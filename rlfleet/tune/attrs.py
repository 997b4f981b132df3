"""Names of the attributes rlfleet keeps on Optuna studies and trials.

They live in the study's storage, so every worker and every later invocation reads them.
"""

from __future__ import annotations

SETUP = "rlfleet:setup"
"""Study: the settings that make its trials comparable (seeds, scoring, base run config)."""
CONFIG = "rlfleet:config"
"""Trial: its run config with the first seed, as `rlfleet train --config` takes it."""
SEED_SCORES = "rlfleet:seed_scores"
"""Trial: the score of every seed finished so far."""
RUN_DIR = "rlfleet:run_dir"
"""Trial: the directory holding its seed run directories."""
ERROR = "rlfleet:error"
"""Failed trial: the exception, as ``Type: message``."""
WORKER = "rlfleet:worker"
"""Trial: ``host:pid`` of the worker that ran it."""
RETRY_OF = "rlfleet:retry_of"
"""Re-queued trial: the number of the interrupted or lost trial it replaces."""
