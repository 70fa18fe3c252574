"""Errors that the user fixes (a bad input file, a missing checkpoint): main prints the message alone."""


class UserError(Exception):
  """A mistake in what the user asked for; the message says what and where, and how to fix it."""
