"""The command line's parts, one job each; `transformer_jax.main` puts them together.

inspect_checkpoints.py is a command line of its own beside main: a work directory's
checkpoints listed and verified (`./launch.sh inspect`).
"""
