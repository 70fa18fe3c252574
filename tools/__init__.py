"""The project's lab tools: benchmarks, the PyTorch reference, the device report and the makers
of generated docs. They live beside the package, not in it: the wheel holds only what a user
imports or runs to train, evaluate, translate, import, export and compile. They run from a
checkout, from its root (`python -m tools.<name>`, or `./launch.sh bench|kernels|device-report|
device-bundle`), and import the package; nothing in the package imports them.

benchmark.py            the benchmarks' command line (`./launch.sh bench`)
step_benchmark.py       the train step on a fixed synthetic batch, timed
decode_benchmark.py     beam search and greedy decoding of a fixed shape, timed
experiment_benchmark.py an experiment's own model on batches of its own data
data_benchmark.py       the training pipeline's batches per second
sweep.py                the scaling sweep: its grid, table and figure
timing.py               what the benchmarks share: timing on the device, summaries
torch_reference.py      the same model in PyTorch, for side-by-side benchmarks
torch_training.py       our model and train step in PyTorch, to hold our training to it
reference_parameters.py its parameters: our names and shapes, fairseq's initial values
training_curves.py      our training against torch_training, update by update
compare_training.py     the command line of training_curves
config_reference.py     docs/config.md, from the settings and the flags
pod_table.py            the paper's models compiled for TPU slices and H100s, as a table
kernel_row.py           a row of docs/performance.md's kernel table (`./launch.sh kernels`)
device_report/          the project measured on an accelerator in one command, and its bundle
"""
