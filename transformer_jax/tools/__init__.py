"""Command-line tools that measure: the training and decoding benchmark (against PyTorch on
request) and the data pipeline benchmark."""
