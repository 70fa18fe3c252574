"""The device report: the project measured on a machine's accelerator in one command, in stages
under one deadline, with an offline bundle of the wheels such a machine lacks (docs/gpu.md).

  plan.py         what is measured, full size or tiny, and each step's time cap
  runner.py       each step a process under its limit; the stages' JSON files, log.txt
  stage.py        one step's process, writing its figures as it gets them
  environment.py, correctness.py, speed.py, prediction.py, largest.py, decoding.py,
  end_to_end.py, multi30k.py   the stages and their steps (the last two: a whole experiment)
  op_times.py     a few train steps traced, their time summed by XLA op
  roofline.py     a train step's own program read for its kernels and floor, beside its time
  markdown.py, markdown_time.py   report.md
  pytest_log.py   a pytest plugin: each test's outcome as it ends
  bundle.py       the wheels a GPU image lacks: made here, installed there offline
  bundle_data.py  the Multi30k text the bundle carries when asked
"""
