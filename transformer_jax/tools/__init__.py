"""Command-line tools: the training and decoding benchmark (against PyTorch on request), the
experiment, data-pipeline and scaling benchmarks, the pod table of compile reports, the config
reference, and the device report with its offline bundle (`tools.device_report`)."""
