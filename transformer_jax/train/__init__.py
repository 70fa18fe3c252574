"""Training: the paper's recipe, the sharded train step, the loop, what it reports, and the wiring.

  objective.py  learning-rate schedule, Adam, FLOPs of a step
  step.py       TrainState, the pure train step, Trainer (sharded init and step)
  loop.py       fit (FitSettings), preemption, runs of non-finite updates
  reporting.py  log lines, TensorBoard, progress bar, MFU
  run.py        train(config, workdir): everything above wired to the data, checkpoints and
                validation BLEU
"""
