"""Errors the user fixes: `UserError` (main prints its message alone) and `FieldError`."""


class UserError(Exception):
  """A mistake in what the user asked for; the message says what and where, and how to fix it."""


class FieldError(UserError, ValueError):
  """An invalid value of one named setting: `owner.field` followed by `detail`.

  `owner` is whatever holds the setting in the raiser's own terms
  (`TransformerConfig`, `data`, `mesh`); `field` may be empty when the whole
  setting is at fault. The experiment config (`transformer_jax.config`) reads
  `field` and `detail` to name the setting as `config.<section>.<field>`.
  """

  def __init__(self, owner: str, field: str, detail: str):
    self.owner, self.field, self.detail = owner, field, detail
    super().__init__(f"{owner}{self.suffix}")

  @property
  def suffix(self) -> str:
    """The message after the owner's name: `.field` (if any) and `detail`."""
    return (f".{self.field}" if self.field else "") + self.detail


def first_line(error: BaseException) -> str:
  """'TypeName: the first line of its message' (at most 400 characters), for one-line reports."""
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:400] if text else ''}"
