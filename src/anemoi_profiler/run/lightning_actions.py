"""The action names Lightning passes to `trainer.profiler`, which the loop timer (`loop_timer.py`) listens for.

They are not API: the fetch actions are built from Lightning's private loop classes (`_TrainingEpochLoop`,
`_EvaluationLoop`) and the rest are strings inside its loops. They live here alone;
tests/test_lightning_actions.py fits a real Trainer of each installed Lightning namespace and fails when one of
them is no longer called. Should Lightning rename one, the figure it feeds is left out (data wait, other
callbacks, the first step's FLOPs), never wrong.
"""

from __future__ import annotations

TRAIN_FETCH = "[_TrainingEpochLoop].train_dataloader_next"
"""Around every fetch from the training dataloader (`training_epoch_loop.py`)."""
VAL_FETCH = "[_EvaluationLoop].val_next"
"""Around every fetch from a validation dataloader (`evaluation_loop.py`)."""
FETCH_ACTIONS = {TRAIN_FETCH: "train", VAL_FETCH: "val"}

CALLBACK_PREFIX = "[Callback]"
"""Every callback hook runs in `profile("[Callback]<state key>.<hook>")` (`trainer/call.py`)."""
TRAINING_STEP = "run_training_batch"
"""The training step alone, without any callback's hooks (`training_epoch_loop.py`)."""
