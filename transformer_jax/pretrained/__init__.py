"""Pretrained Marian (OPUS-MT) translation models: import into a work directory, export back.

  import_marian(source, workdir)                          a Marian directory -> a work directory
  export_marian(experiment, workdir, output, checkpoint)  a work directory -> a Marian directory
Command line: python -m transformer_jax.pretrained import|export (see `__main__`).
"""

from transformer_jax.pretrained.convert import export_marian, import_marian

__all__ = ["export_marian", "import_marian"]
