"""Translating sentences with a trained model: lines in, the same number of lines out, in order.

`Translator` tokenizes sentences (cutting those longer than the model's
positions, with a warning naming the line), decodes them in batches of
similar length with beam search or greedy decoding, sharded along the batch
over the mesh, and returns the translations in input order. Lines without a
token (empty, or only spaces) translate to empty lines without decoding.
"""

import dataclasses
import logging
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer_jax import schema
from transformer_jax.conventions import EOS_ID
from transformer_jax.data import padded_length
from transformer_jax.decode import search, transformer_search
from transformer_jax.placement import COMPILE_AHEAD, Placement, compiled_ahead_line, host_cores

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """How to decode (`config.decode`; the paper: beam 4, alpha 0.6, input length + 50) and, for
  `--mode=eval`, what; validated on construction (FieldError naming `decode.<field>`)."""

  beam_size: int = schema.setting(4, "beam size of eval and translate", ge=1, means={1: "greedy"})
  alpha: float = schema.setting(
    0.6,
    "exponent of the length penalty: ((5 + len) / 6) ** alpha (gnmt) or len ** alpha (length)",
    ge=0,
  )
  length_normalization: str = schema.setting(
    "gnmt",
    "beam scores are summed log-probabilities over the paper's GNMT penalty, or over "
    "len ** alpha as Hugging Face's beam search divides them",
    choices=("gnmt", "length"),
  )
  max_extra: int = schema.setting(
    50, "output tokens <= source tokens + max_extra (and <= model.max_len)", ge=0
  )
  max_length: int = schema.setting(
    0,
    "output tokens <= max_length - 1, EOS included, whatever the source (Hugging Face's "
    "max_length, which counts the decoder's start token)",
    ge=2,
    also=(0,),
    means={0: "no cap"},
  )
  force_eos: bool = schema.setting(
    False,
    "an output that reaches its limit ends with EOS, scored "
    "log-probability 0 (Hugging Face's forced_eos_token_id)",
  )
  early_stopping: str = schema.setting(
    "exact",
    "when a sentence's beam search stops: exact (no beam can improve; Hugging Face's "
    "early_stopping='never'), heuristic (its default, False) or first_k (True)",
    choices=search.EARLY_STOPPING,
  )
  renormalize: bool = schema.setting(
    False,
    "log-probabilities are renormalized over the tokens "
    "other than pad (Hugging Face's renormalize_logits); off: "
    "pad's share is dropped",
  )
  batch_size: int = schema.setting(
    128, "sentences per decoding batch (rounded up to the batch shards)", ge=1
  )
  compile_ahead: str = schema.setting(
    "always",
    "the search of every batch shape the sentences make (each one a batch runs), compiled "
    "before the first batch on up to one thread per CPU core: always, never (each when its "
    "first batch comes), or on GPUs and TPUs only",
    choices=COMPILE_AHEAD,
  )
  split: str = schema.setting("test", "the split --mode=eval decodes", nonempty=True)
  tokenized_bleu: bool = schema.setting(
    False, "--mode=eval also reports the paper's tokenized BLEU"
  )
  as_is_bleu: bool = schema.setting(
    False,
    "--mode=eval also reports BLEU on the text as it is, "
    "split at spaces (multi-bleu.perl, fairseq): for corpora "
    "already tokenized, such as multi30k_tok",
  )

  def __post_init__(self):
    schema.check(self, "decode")

  @property
  def search(self) -> str:
    """The search, as files and records name it: 'greedy' or 'beam4'."""
    return "greedy" if self.beam_size == 1 else f"beam{self.beam_size}"

  def search_call(self, source_length: int, positions: int):
    """(jitted search, its keyword arguments) for sources padded to `source_length` tokens and a
    model of `positions` positions.

    The output buffer is the longest output any sentence may have (source
    + `max_extra` rounded up to a padded length, capped by `max_length - 1`
    and `positions`), so only a few shapes compile; the buffer is itself the
    cap of every sentence's output.
    """
    buffer = min(padded_length(source_length + self.max_extra), positions)
    if self.max_length:
      buffer = min(buffer, self.max_length - 1)
    common = dict(
      max_len=buffer,
      max_extra=self.max_extra,
      force_eos=self.force_eos,
      renormalize=self.renormalize,
    )
    if self.beam_size == 1:
      return transformer_search.greedy_search, common
    return transformer_search.beam_search, dict(
      common,
      beam_size=self.beam_size,
      alpha=self.alpha,
      length_normalization=self.length_normalization,
      early_stopping=self.early_stopping,
    )


def _abstract(array) -> jax.ShapeDtypeStruct:
  """`array`'s shape and type, with its sharding where it is committed to one (a jitted call
  places an uncommitted array itself)."""
  sharding = array.sharding if getattr(array, "committed", False) else None
  return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=sharding)


class Translator:
  """Translates with a placed model: beam search when `settings.beam_size > 1`, else greedy.

  Sentences are sorted by length and decoded `batch_size` at a time. Batch
  rows are rounded up to a power of two (times the batch shards) and source
  lengths to the padded lengths of the data pipeline, and the output buffer
  follows from the source length, so only a few shapes compile. Sentence `i`
  gets at most its source tokens (EOS included) + `max_extra` output tokens
  (the paper: input length + 50), never more than `max_length - 1` (when
  set) nor the model's `max_len`.
  """

  def __init__(self, placement: Placement, tokenizer, settings: DecodeSettings):
    self.placement, self.tokenizer, self.settings = placement, tokenizer, settings
    shards = placement.batch_shards
    self.batch_size = -(-settings.batch_size // shards) * shards
    # (rows, source length) -> (the parameters' abstract tree it was compiled for, program, or
    # None where that compile failed: its batches compile their own, and it is not tried again).
    self.compiled_ahead: dict[tuple[int, int], tuple] = {}

  @property
  def max_len(self) -> int:
    """Positions the model encodes: the most tokens (EOS included) a source or output may have."""
    return self.placement.model.config.max_len

  def encode(self, lines) -> list[list[int]]:
    """Source ids of each line, EOS appended; `[]` for a line without tokens.

    A line with more tokens than `max_len` is cut to its first `max_len - 1`
    and EOS, with a warning naming the line (1-based).
    """
    sources = []
    for number, line in enumerate(lines, 1):
      ids = self.tokenizer.encode(line)
      if len(ids) >= self.max_len:
        log.warning(
          "line %d has %d tokens, more than the model's %d positions allow: "
          "translating its first %d",
          number,
          len(ids) + 1,
          self.max_len,
          self.max_len - 1,
        )
        ids = ids[: self.max_len - 1]
      sources.append(ids + [EOS_ID] if ids else [])
    return sources

  def translate(self, params, lines) -> list[str]:
    """Translations of `lines` (strings), one per line, in order."""
    return [self.tokenizer.decode(ids) for ids in self.translate_ids(params, self.encode(lines))]

  def translate_ids(self, params, sources) -> list[list[int]]:
    """Output ids (EOS removed) of source id lists (EOS included), in order; `[]` for `[]`.

    Every process passes the same `sources` and gets every output back.
    """
    outputs = [[] for _ in sources]
    order = sorted((i for i, ids in enumerate(sources) if ids), key=lambda i: len(sources[i]))
    batches = [
      order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)
    ]
    programs = {}
    if self.placement.should_compile_ahead(self.settings.compile_ahead):
      abstract = jax.tree.map(_abstract, params)
      self._compile_ahead(abstract, {self._shape([sources[i] for i in b]) for b in batches})
      # The programs compiled ahead for parameters like these.
      programs = {s: p for s, (a, p) in self.compiled_ahead.items() if a == abstract and p}
    for batch in batches:
      for i, ids in zip(batch, self._decode(params, [sources[i] for i in batch], programs)):
        outputs[i] = ids
    return outputs

  def _shape(self, sources) -> tuple[int, int]:
    """The `(rows, source length)` of the batch that decodes `sources`."""
    rows = self.placement.batch_shards
    while rows < len(sources):
      rows *= 2
    return min(rows, self.batch_size), min(padded_length(max(map(len, sources))), self.max_len)

  def _compile_ahead(self, abstract, shapes) -> None:
    """Compile the search for parameters like `abstract` (their shapes, types and shardings) and
    each `(rows, length)` of `shapes` that has no program for them yet, on threads; with only
    one to compile, none (its batch compiles it)."""
    shapes = sorted(s for s in shapes if self.compiled_ahead.get(s, (None,))[0] != abstract)
    if len(shapes) < 2:
      return

    def lowering(rows, length):
      run, kwargs = self.settings.search_call(length, self.max_len)
      inputs = jax.ShapeDtypeStruct(
        (rows, length), np.int32, sharding=self.placement.batch_sharding
      )
      return lambda: run.lower(self.placement.model, {"params": abstract}, inputs, **kwargs)

    threads = min(len(shapes), host_cores())
    start = time.perf_counter()
    compiled = self.placement.compile_ahead([lowering(*shape) for shape in shapes], threads)
    for shape, (program, _) in zip(shapes, compiled):
      self.compiled_ahead[shape] = (abstract, program)
    wall = time.perf_counter() - start
    if done := [(shape, t) for shape, (program, t) in zip(shapes, compiled) if program]:
      log.info("%s", compiled_ahead_line(f"the {self.settings.search}", done, wall, threads))

  def _decode(self, params, sources, programs) -> list[list[int]]:
    """One batch: source id lists (at most `batch_size`, none over `max_len`) -> output ids;
    `programs`: those compiled ahead for these parameters, by `(rows, length)`."""
    rows, length = self._shape(sources)
    host = np.zeros((rows, length), np.int32)
    for row, ids in enumerate(sources):
      host[row, : len(ids)] = ids
    inputs = jax.make_array_from_callback(
      host.shape, self.placement.batch_sharding, lambda index: host[index]
    )
    run, kwargs = self.settings.search_call(length, self.max_len)
    program = programs.get((rows, length))
    if program:  # The compiled program takes the options that are not static.
      traced = {k: v for k, v in kwargs.items() if k not in transformer_search.STATIC_OPTIONS}
      out = self.placement.run(lambda: program({"params": params}, inputs, **traced))
    else:
      model = self.placement.model
      out = self.placement.run(lambda: run(model, {"params": params}, inputs, **kwargs))
    tokens = multihost_utils.process_allgather(out.tokens, tiled=True)
    return search.trim(tokens)[: len(sources)]
