"""Training: the paper's recipe, the sharded train step, the loop, and what it reports.

objective.py   learning-rate schedule, Adam, FLOPs of a step
step.py        TrainState, the pure train step, Trainer (sharded init and step)
loop.py        fit (FitSettings), preemption, runs of non-finite updates
reporting.py   log lines, TensorBoard, progress bar, MFU
events.py      TensorBoard event files, written without TensorFlow
validation.py  validation BLEU during training; the best parameters in best/ and best.json

experiment/training.py wires them to the data, the checkpoints and validation.
"""
