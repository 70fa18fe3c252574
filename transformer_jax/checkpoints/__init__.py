"""Checkpoints: Orbax store (the one reader of what a step holds), integrity fingerprints,
recovery from broken and failed checkpoints, averaging, and inspection.

  store.py      make_manager, save/restore (train state + data position), params-only
                checkpoints, saved_arrays / saved_fingerprints / saved_info, check_layout
  integrity.py  fingerprints of a state and a data position
  recovery.py   resume from the newest good step; CheckpointWriter for saves that fail
  average.py    the float32 mean of several checkpoints' parameters, on sharded arrays
  inspect.py    `python -m transformer_jax.checkpoints.inspect --workdir=DIR [--verify]`
"""
