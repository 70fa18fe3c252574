"""Training: the paper's recipe, the sharded train step of any model and loss, the loop, and what
it reports.

objective.py   learning-rate schedule, Adam
step.py        TrainState, the pure train step, Trainer (sharded init and step) of a
               `model.spec.ModelSpec` and a loss function
loop.py        fit (FitSettings), preemption, runs of non-finite updates
reporting.py   log lines, TensorBoard, progress bar, MFU
events.py      TensorBoard event files, written without TensorFlow
validation.py  validation BLEU during training; the best parameters in best/ and best.json

experiment/training.py wires them to the data, the checkpoints and validation.
"""
