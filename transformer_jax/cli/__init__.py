"""The command line's parts, one job each; `transformer_jax.main` puts them together."""
