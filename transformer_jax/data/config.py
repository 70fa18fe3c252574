"""The data config (`config.data`): defaults for the embedded dataset, and its validation."""

import ml_collections

from transformer_jax.errors import FieldError

DATASETS = {
    # name: the language pair it holds
    "embedded": ("en", "sy"),
    "embedded_tiny": ("en", "sy"),
    "wmt14_translate/de-en": ("de", "en"),
    "wmt14_translate/fr-en": ("fr", "en"),
    "wmt17_translate/de-en": ("de", "en"),
    "text": None,  # any two languages: files <prefix>.<source_lang>, <prefix>.<target_lang>
}
BATCH_MODES = ("tokens", "packed", "padded")
OVERLONG = ("drop", "truncate")


def default_config():
  """The `config.data` ConfigDict with every field (defaults: the embedded dataset)."""
  c = ml_collections.ConfigDict()
  c.name = "embedded"  # dataset: one of DATASETS (wmt14_translate/de-en, text, ...)
  c.source_lang = "en"  # translate from this language of the pair
  c.target_lang = "sy"  # into this one (swap the two to reverse the direction)
  c.data_dir = ""  # TFDS data dir ('' = $TFDS_DATA_DIR or ~/tensorflow_datasets)
  c.manual_dir = ""  # WMT files downloaded by hand ('' = <data_dir>/downloads/manual)
  c.text_train = ""  # 'text': path prefix of the training files <prefix>.<lang>
  c.text_validation = ""  # 'text': path prefix of the validation files
  c.text_test = ""  # 'text': path prefix of the test files ('' = no test split)
  c.train_split = "train"  # split to train on
  c.eval_split = "validation"  # split evaluated during training
  c.vocab_size = 1000  # shared SentencePiece BPE vocabulary (paper: 37000 EN-DE, 32000 EN-FR); a size the training text cannot fill (or its characters do not fit) stops the run, naming the largest (smallest) size that works
  c.vocab_path = ""  # SentencePiece model, or a directory of Marian files source.spm, target.spm, vocab.json ('' = <workdir>/vocab/<dataset>-<langs>-<size>.model)
  c.tokenizer_sample_size = 200_000  # at most this many training pairs (evenly spaced) train the vocabulary
  c.batch_mode = "tokens"  # 'tokens': length-bucketed batches (paper); 'packed': packed rows; 'padded': one pair per row, every row max(max_source_length, max_target_length) long (one shape)
  c.bucket_growth = 1.25  # 'tokens': each bucket length is about this times the one before (8, 16, 24, 32, 40, 56, ... at 1.25; 8, 16, 32, 64, ... at 2); fewer buckets compile fewer train steps but pad more
  c.tokens_per_batch = 4096  # 'tokens', 'padded': max source and max target tokens (padding included) per global batch
  c.batch_size = 32  # 'packed': rows per global batch
  c.max_length = 128  # 'packed': tokens per row
  c.max_source_length = 72  # training pairs with more source tokens (EOS included) are over-long
  c.max_target_length = 72  # training pairs with more target tokens (EOS included) are over-long
  c.overlong = "drop"  # over-long training pairs: 'drop' or 'truncate' (evaluation keeps all)
  c.batch_multiple = 8  # global batch rows are a multiple of this (the data-parallel device count)
  c.window = 16384  # training pairs grouped by length / packed together (more: less padding)
  c.num_workers = 0  # Grain worker processes (0 = one background thread in this process)
  c.eval_batch_size = 64  # rows per global evaluation batch
  return c


def _fail(field, value, allowed):
  raise FieldError("data", field, f"={value!r} is invalid: allowed {allowed}.")


_STRINGS = ("name", "source_lang", "target_lang", "data_dir", "manual_dir", "text_train",
            "text_validation", "text_test", "train_split", "eval_split", "vocab_path",
            "batch_mode", "overlong")


def validate_config(c):
  """Raises FieldError naming the field `data.xxx` and what it allows; returns `c`."""
  known = default_config()
  unknown = sorted(set(c) - set(known))
  if unknown:
    raise FieldError("data", unknown[0], f" is not a known field; known fields: "
                     f"{', '.join(known)}.")
  missing = [field for field in known if field not in c]
  if missing:
    raise FieldError("data", missing[0], " is missing.")
  for field in _STRINGS:
    if not isinstance(getattr(c, field), str):
      _fail(field, getattr(c, field), "a string")
  if c.name not in DATASETS:
    _fail("name", c.name, " | ".join(DATASETS))
  pair = DATASETS[c.name]
  for field in ("source_lang", "target_lang"):
    value = getattr(c, field)
    if pair is not None and value not in pair:
      _fail(field, value, f"a language of {c.name}: {' | '.join(pair)}")
    if pair is None and not (isinstance(value, str) and value.isidentifier()):
      _fail(field, value, "a language code such as 'en' (the file suffix)")
  if c.source_lang == c.target_lang:
    _fail("target_lang", c.target_lang, "a language other than data.source_lang")
  if c.name == "text" and not c.text_train:
    _fail("text_train", c.text_train,
          "a path prefix (files <prefix>.<lang>) when data.name='text'")
  if c.batch_mode not in BATCH_MODES:
    _fail("batch_mode", c.batch_mode, " | ".join(BATCH_MODES))
  if c.overlong not in OVERLONG:
    _fail("overlong", c.overlong, " | ".join(OVERLONG))
  for field in ("vocab_size", "tokenizer_sample_size", "tokens_per_batch",
                "batch_size", "max_length", "max_source_length",
                "max_target_length", "batch_multiple", "window",
                "eval_batch_size"):
    value = getattr(c, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      _fail(field, value, "a positive integer")
  if c.vocab_size < 16:
    _fail("vocab_size", c.vocab_size, "at least 16")
  if (isinstance(c.bucket_growth, bool) or not isinstance(c.bucket_growth, (int, float))
      or not 1 < c.bucket_growth <= 4):
    _fail("bucket_growth", c.bucket_growth, "a number in (1, 4]")
  if not isinstance(c.num_workers, int) or isinstance(c.num_workers, bool) or c.num_workers < 0:
    _fail("num_workers", c.num_workers, "an integer >= 0")
  if c.batch_mode == "packed":
    for field in ("max_source_length", "max_target_length"):
      if getattr(c, field) > c.max_length:
        _fail(field, getattr(c, field),
              f"at most data.max_length={c.max_length} in 'packed' mode")
  for field in ("batch_size",) * (c.batch_mode == "packed") + ("eval_batch_size",):
    if getattr(c, field) % c.batch_multiple:
      _fail(field, getattr(c, field),
            f"a multiple of data.batch_multiple={c.batch_multiple}")
  return c
