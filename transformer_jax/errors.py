"""Errors the user fixes: `UserError` (main prints its message alone) and `FieldError`."""


class UserError(Exception):
  """A mistake in what the user asked for; the message says what and where, and how to fix it."""


class FieldError(UserError, ValueError):
  """An invalid value of one named setting of an experiment: its `path`, then `detail`.

  `owner` is the section holding the setting (`model`, `data.vocab`, `mesh`, or ''
  for the experiment's top-level fields), `field` its name (empty when the
  whole section is at fault): `data.vocab.size=3 ...`. The command line names
  it as `config.<path>`.
  """

  def __init__(self, owner: str, field: str, detail: str):
    self.owner, self.field, self.detail = owner, field, detail
    super().__init__(self.path + detail)

  @property
  def path(self) -> str:
    """`owner.field`, without the parts that are empty."""
    return ".".join(part for part in (self.owner, self.field) if part)


def first_line(error: BaseException) -> str:
  """'TypeName: the first line of its message' (at most 400 characters), for one-line reports."""
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:400] if text else ''}"
