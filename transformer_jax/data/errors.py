"""The errors of the data package the user fixes (a module of its own, so every source has them)."""

from transformer_jax.errors import UserError


class DataError(UserError):
  """The user's data cannot be used: the message names the file or split and what is wrong."""


class DataUnavailableError(UserError):
  """A dataset is not prepared and cannot be made: the message says how to provide it."""
