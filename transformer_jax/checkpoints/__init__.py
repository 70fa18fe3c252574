"""Checkpoints: Orbax store (the one reader of what a step holds), integrity fingerprints,
recovery from broken and failed checkpoints, and averaging.

  store.py      make_manager, save/restore (train state + data position), params-only
                checkpoints, saved_arrays / saved_fingerprints / saved_info, check_layout
  reading.py    a read on every process that all use or none; the checkpoint errors
  integrity.py  fingerprints of a state and a data position
  recovery.py   resume from the newest good step; CheckpointWriter for saves that fail
  average.py    the float32 mean of several checkpoints' parameters, on sharded arrays

The command line that lists and verifies them: cli/inspect_checkpoints.py (./launch.sh inspect).
"""
