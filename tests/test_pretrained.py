"""Marian (OPUS-MT) models: import, equality with Hugging Face's model and tokenizer, export,
fine-tuning through the command line.

The Marian models are random and tiny, built here with every difference from
the paper's model turned on (random biases and logits bias, swish or relu,
epsilon 1e-5, ids eos 0 / pad last, two SentencePiece models trained here);
the comparisons need `torch` and `transformers` (the `test` extra installs
them).
"""

import dataclasses
import io
import json
import os
import re
import shutil
import sys

import jax
import numpy as np
import pytest
import sentencepiece as spm
from absl import flags as absl_flags
from ml_collections import config_flags

import helpers
from transformer_jax import config as config_lib
from transformer_jax import data
from transformer_jax.conventions import EOS_ID
from transformer_jax.data import marian as marian_vocab
from transformer_jax.decode import search, transformer_search
from transformer_jax.errors import FieldError, UserError
from transformer_jax.experiment import Checkpoint, evaluate_split, load, translate_file
from transformer_jax.model.transformer import Transformer
from transformer_jax.pretrained import convert, generation, marian, weights
from transformer_jax.workdir import Workdir

pytestmark = [
  pytest.mark.hf,
  pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]
torch = pytest.importorskip(
  "torch", reason="comparing with Hugging Face needs torch (pip install -e '.[hf]')"
)
transformers = pytest.importorskip(
  "transformers", reason="comparing with Hugging Face needs transformers (pip install -e '.[hf]')"
)

TINY = dict(
  d_model=16,
  encoder_layers=2,
  decoder_layers=2,
  encoder_ffn_dim=32,
  decoder_ffn_dim=32,
  encoder_attention_heads=2,
  decoder_attention_heads=2,
  max_position_embeddings=256,
  dropout=0.0,
  scale_embedding=True,
)
# Characters the SentencePiece models never saw, and a language code.
UNSEEN = ["Zürich ☃ 漢字 ok", "ünïcödé ∑ x", ">>deu<< a b c", "", "  spaces   inside  "]


@pytest.fixture(scope="module")
def corpus(shared):
  pairs = [
    (s, t)
    for s, t in zip(*data.split_texts(helpers.tiny_data_config(shared), "train"))
    if len(s) < 40 and len(t) < 40
  ][:2000]
  return [s for s, _ in pairs], [t for _, t in pairs]


def train_spm(sentences, vocab_size):
  buffer = io.BytesIO()
  with open(os.devnull, "w") as quiet:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=buffer,
      logstream=quiet,
      vocab_size=vocab_size,
      model_type="unigram",
      character_coverage=1.0,
    )
  return buffer.getvalue()


# The decoding settings OPUS-MT models ship in generation_config.json (their max_length is 512;
# a short one makes many outputs reach it).
OPUS_MT_GENERATION = dict(num_beams=4, max_length=16, renormalize_logits=True)


def marian_directory(path, corpus, *, activation="swish", seed=0, eos_bias=1.3, **layers):
  """A random MarianMTModel (TINY, with `layers` such as decoder_layers=1) and its tokenizer files
  saved in `path`, with OPUS-MT's generation settings (forced EOS, pad never generated,
  renormalized log-probabilities, beam 4); returns the model."""
  sources, targets = corpus
  protos = {"source.spm": train_spm(sources, 120), "target.spm": train_spm(targets, 100)}
  pieces = []
  for proto in protos.values():
    processor = spm.SentencePieceProcessor(model_proto=proto)
    pieces += [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
  # Marian's numbering: eos 0, unk 1, the pieces (some dropped: unknown to vocab.json), pad last.
  kept = [p for i, p in enumerate(dict.fromkeys(pieces)) if i % 9 != 4]
  vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(kept)}}
  vocab["<pad>"] = len(vocab)
  path.mkdir(parents=True, exist_ok=True)
  for name, proto in protos.items():
    (path / name).write_bytes(proto)
  (path / "vocab.json").write_text(json.dumps(vocab))
  size = len(vocab)
  config = transformers.MarianConfig(
    **{**TINY, **layers},
    vocab_size=size,
    decoder_vocab_size=size,
    activation_function=activation,
    pad_token_id=size - 1,
    decoder_start_token_id=size - 1,
    eos_token_id=0,
    forced_eos_token_id=0,
  )
  torch.manual_seed(seed)
  model = transformers.MarianMTModel(config).eval()
  with torch.no_grad():
    for name, tensor in model.state_dict().items():
      if "embed_positions" not in name:
        # LayerNorm scales near 1, so that the outputs depend on the input.
        tensor.copy_(0.3 * torch.randn_like(tensor) + ("layer_norm.weight" in name))
    model.final_logits_bias[0, 0] += eos_bias  # Marian's EOS: some outputs end, some reach the cap.
  model.generation_config.update(bad_words_ids=[[size - 1]], **OPUS_MT_GENERATION)
  model.save_pretrained(path)
  return model


@pytest.fixture(scope="module")
def imported(tmp_path_factory, corpus):
  """(Hugging Face model, its tokenizer, our work directory, our config) of a swish model."""
  root = tmp_path_factory.mktemp("marian")
  model = marian_directory(root / "marian", corpus)
  result = convert.import_marian(str(root / "marian"), Workdir(str(root / "work")))
  config = config_lib.parse(config_lib.load_file(result["config"]))
  tokenizer = transformers.MarianTokenizer.from_pretrained(str(root / "marian"))
  return model, tokenizer, root / "work", config


def ours(workdir, config):
  """Our model, parameters and tokenizer loaded from the work directory."""
  loaded = load(config, Workdir(str(workdir)))
  return loaded.placement.model, loaded.params, loaded.tokenizer


def padded(rows):
  width = max(len(r) for r in rows)
  return np.array([r + [0] * (width - len(r)) for r in rows], np.int64)


def host_params(workdir, config):
  return jax.device_get(ours(workdir, config)[1])


def logits_difference(hf, hf_tokenizer, workdir, config, sources, targets):
  """Max abs difference of our logits and Hugging Face's on a padded batch of pairs."""
  model, params, tokenizer = ours(workdir, config)
  order = np.asarray(marian_vocab.project_order(hf_tokenizer.get_vocab()))
  assert hf.config.pad_token_id == order[0] and hf.config.decoder_start_token_id == order[0]
  ids = [tokenizer.encode(s) + [EOS_ID] for s in sources]
  out = [tokenizer.encode_target(t) + [EOS_ID] for t in targets]
  inputs, labels = padded(ids), padded(out)
  logits = np.asarray(jax.jit(model.apply)({"params": params}, inputs, labels))
  with torch.no_grad():
    want = hf(
      input_ids=torch.tensor(order[inputs]),
      attention_mask=torch.tensor(inputs != 0),
      labels=torch.tensor(np.where(labels != 0, order[labels], -100)),
    ).logits.numpy()
  real = labels != 0
  return np.abs(logits[real] - want[real][:, order]).max()


@pytest.mark.slow
def test_logits_equal_hugging_face_on_padded_batches(imported, corpus):
  difference = logits_difference(*imported, corpus[0][:6], corpus[1][:6])
  print(f"logits max abs difference {difference:.2e}")
  assert difference <= 1e-5


def test_a_relu_model_with_a_deeper_encoder_imports_with_equal_logits(tmp_path, corpus):
  hf = marian_directory(
    tmp_path / "marian", corpus, activation="relu", seed=1, encoder_layers=3, decoder_layers=1
  )
  result = convert.import_marian(str(tmp_path / "marian"), Workdir(str(tmp_path / "work")))
  config = config_lib.parse(config_lib.load_file(result["config"]))
  assert (config.model.activation, config.model.num_layers, config.model.decoder_depth) == (
    "relu",
    3,
    1,
  )
  hf_tokenizer = transformers.MarianTokenizer.from_pretrained(str(tmp_path / "marian"))
  assert (
    logits_difference(hf, hf_tokenizer, tmp_path / "work", config, corpus[0][6:10], corpus[1][6:10])
    <= 1e-5
  )


@pytest.mark.slow
def test_greedy_outputs_equal_generate(imported, corpus):
  hf, hf_tokenizer, workdir, config = imported
  model, params, tokenizer = ours(workdir, config)
  order = np.asarray(marian_vocab.project_order(hf_tokenizer.get_vocab()))
  ids = [tokenizer.encode(s) + [EOS_ID] for s in corpus[0][:8]]
  inputs = padded(ids).astype(np.int32)
  extra = 12
  decoded = transformer_search.greedy_search(
    model, {"params": params}, inputs, max_len=256, max_extra=extra
  )
  got = search.trim(np.asarray(decoded.tokens))
  with torch.no_grad():
    generated = hf.generate(
      input_ids=torch.tensor(order[inputs]),
      attention_mask=torch.tensor(inputs != 0),
      num_beams=1,
      do_sample=False,
      max_new_tokens=inputs.shape[1] + extra,
      forced_eos_token_id=None,
      bad_words_ids=[[hf.config.pad_token_id]],
    ).numpy()
  ended = 0
  for row, (source, hyp) in enumerate(zip(ids, got)):
    theirs = [
      int(t) for t in generated[row, 1 : len(source) + extra + 1]
    ]  # Our limit, EOS included.
    if 0 in theirs:  # Marian's EOS.
      theirs, ended = theirs[: theirs.index(0)], ended + 1
    assert [int(order[t]) for t in hyp] == theirs, row
  assert ended >= 1  # Some sentences end with EOS before the limit.


def test_tokenizer_ids_equal_marian_tokenizer(imported, corpus):
  _, hf_tokenizer, workdir, config = imported
  tokenizer = ours(workdir, config)[2]
  order = np.asarray(marian_vocab.project_order(hf_tokenizer.get_vocab()))
  sentences = corpus[0][:150] + corpus[1][:150] + UNSEEN
  for sentence in sentences:
    want = hf_tokenizer(sentence)["input_ids"]
    assert [int(order[i]) for i in tokenizer.encode(sentence) + [EOS_ID]] == want, sentence
    want = hf_tokenizer(text_target=sentence)["input_ids"]
    assert [int(order[i]) for i in tokenizer.encode_target(sentence) + [EOS_ID]] == want
  assert any(2 in tokenizer.encode(s) for s in UNSEEN)  # Unknown pieces are UNK_ID.
  for sentence in corpus[1][:20]:
    ids = tokenizer.encode_target(sentence)
    assert tokenizer.decode(ids + [EOS_ID, 5]) == hf_tokenizer.decode(
      [int(order[i]) for i in ids], skip_special_tokens=True
    )


def cli(shared, module, *args, status=0):
  """`python -m <module> args...` in a subprocess; its stdout (and stderr on failure)."""
  result = helpers.python("-m", module, *args, shared=shared, timeout=600)
  assert result.returncode == status, result.stderr[-4000:]
  return result.stdout if status == 0 else result.stderr


def data_flags(shared, **overrides):
  """Flags of the embedded_tiny data, for a work directory's own config.py."""
  values = {
    "data.source.name": "embedded_tiny",
    "data.source.data_dir": shared / "tfds",
    **overrides,
  }
  return [f"--config.{name.replace('__', '.')}={value}" for name, value in values.items()]


def hf_outputs(hf, hf_tokenizer, sentences, num_beams, **settings):
  """Hugging Face's translations and generated lengths (EOS included): `generate` with the
  model's generation settings, `num_beams` and `settings`."""
  texts, lengths = [], []
  for sentence in sentences:
    batch = hf_tokenizer([sentence], return_tensors="pt")
    with torch.no_grad():
      out = hf.generate(**batch, num_beams=num_beams, **settings)
    texts.append(hf_tokenizer.decode(out[0], skip_special_tokens=True))
    lengths.append(out.shape[1] - 1)
  return texts, lengths


@pytest.mark.slow
def test_translations_equal_generate_on_every_line_and_eval_runs(
  imported, corpus, shared, tmp_path
):
  """OPUS-MT's generation settings: forced EOS at max_length 16 (15 output tokens), pad never
  generated, renormalized log-probabilities, beam 4 with len ** 1.0 and Hugging Face's default
  early stopping; greedy and beam, many lines reach the cap. The other stopping rules against
  Hugging Face's same setting (exact: "never", first_k: True). Greedy through the command line
  with the imported config.py, the rest in-process."""
  hf, hf_tokenizer, workdir, config = imported
  sentences = corpus[0][-30:] + ["Zürich ☃"]
  (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
  translate = [
    f"--config={workdir}/config.py",
    f"--workdir={workdir}",
    "--mode=translate",
    f"--input={tmp_path / 'in.txt'}",
    f"--output={tmp_path / 'out.txt'}",
  ]
  hf_stops = {
    "heuristic": {},
    "exact": {"early_stopping": "never"},
    "first_k": {"early_stopping": True},
  }
  for beams, stop in ((1, "heuristic"), (4, "heuristic"), (4, "exact"), (4, "first_k")):
    if beams == 1:  # The work directory's own config.py through the command line.
      cli(
        shared,
        "transformer_jax.main",
        *translate,
        f"--config.decode.beam_size={beams}",
        f"--config.decode.early_stopping={stop}",
      )
    else:
      settings = dataclasses.replace(
        config, decode=dataclasses.replace(config.decode, beam_size=beams, early_stopping=stop)
      )
      translate_file(
        settings,
        Workdir(str(workdir)),
        Checkpoint(),
        str(tmp_path / "in.txt"),
        str(tmp_path / "out.txt"),
      )
    got = (tmp_path / "out.txt").read_text().splitlines()
    want, lengths = hf_outputs(hf, hf_tokenizer, sentences, beams, **hf_stops[stop])
    assert got == want, (beams, stop)
    capped = sum(n == OPUS_MT_GENERATION["max_length"] - 1 for n in lengths)
    print(f"beam {beams} {stop}: {len(got)} lines equal, {capped} at the cap")
    assert 3 <= capped <= len(sentences) - 5  # Lines that end, and lines cut at the cap.
  test_split = dataclasses.replace(
    config,
    data=helpers.data_config(
      config.data, source__name="embedded_tiny", source__data_dir=str(shared / "tfds")
    ),
    decode=dataclasses.replace(config.decode, split="test"),
  )
  record = evaluate_split(test_split, Workdir(str(workdir)))
  assert record == json.loads((workdir / "eval" / "test-step0-beam4.json").read_text())
  assert record["sentences"] > 0 and record["step"] == 0 and 0 <= record["bleu"] <= 100
  assert (
    record["beam_size"],
    record["length_normalization"],
    record["alpha"],
    record["max_length"],
    record["force_eos"],
    record["renormalize"],
    record["early_stopping"],
  ) == (4, "length", 1.0, 16, True, True, "heuristic")


# A model trained here that Marian can represent: post-LN, sinusoidal, d_k = d_model / heads.
MARIAN_COMPATIBLE = dict(
  model__norm="post",
  model__attention_bias=True,
  model__logits_bias=True,
  model__activation="gelu",
  model__norm_epsilon=1e-5,
  num_train_steps=2,
  decode__length_normalization="length",
)


@pytest.mark.slow
def test_export_loads_in_hugging_face_with_equal_logits_and_imports_back_bit_identical(
  shared, tmp_path, monkeypatch
):
  monkeypatch.chdir(helpers.REPO)  # The flags name experiments/default.py.
  trained, exported = tmp_path / "trained", tmp_path / "exported"
  helpers.Run(shared, trained, **MARIAN_COMPATIBLE).succeed()
  printed = cli(
    shared,
    "transformer_jax.pretrained",
    "export",
    *helpers.flags(shared, **MARIAN_COMPATIBLE),
    f"--workdir={trained}",
    f"--output={exported}",
  )
  assert "exported step 2" in printed
  hf = transformers.MarianMTModel.from_pretrained(str(exported)).eval()
  generation = hf.generation_config
  assert (
    generation.num_beams,
    generation.length_penalty,
    generation.bad_words_ids,
    generation.max_length,
  ) == (4, 0.6, [[hf.config.pad_token_id]], hf.config.max_position_embeddings + 1)  # Its positions.
  hf_tokenizer = transformers.MarianTokenizer.from_pretrained(str(exported))
  config = config_of_flags(shared, MARIAN_COMPATIBLE)
  _, params, tokenizer = ours(trained, config)
  order = np.asarray(marian_vocab.project_order(hf_tokenizer.get_vocab()))
  sources = ["A small dog sees the lake.", "Some kings walk.", "Zürich ☃"]
  targets = ["Setui kuraben.", "Vuzuvoe lenu lisat fipi.", "x"]
  for sentence in sources:
    assert [int(order[i]) for i in tokenizer.encode(sentence) + [EOS_ID]] == hf_tokenizer(sentence)[
      "input_ids"
    ]
  difference = logits_difference(hf, hf_tokenizer, trained, config, sources, targets)
  print(f"exported logits max abs difference {difference:.2e}")
  assert difference <= 1e-5

  reimported = tmp_path / "reimported"
  printed = cli(
    shared,
    "transformer_jax.pretrained",
    "import",
    f"--marian={exported}",
    f"--workdir={reimported}",
  )
  assert printed.startswith("imported ") and f"--config={reimported}/config.py" in printed
  again = host_params(
    reimported, config_lib.parse(config_lib.load_file(str(reimported / "config.py")))
  )
  for want, got in zip(helpers.leaves(jax.device_get(params)), helpers.leaves(again), strict=True):
    np.testing.assert_array_equal(got, want)

  with pytest.raises(FieldError) as refused:
    convert.export_marian(
      config_of_flags(shared, {**MARIAN_COMPATIBLE, "model__norm_epsilon": 1e-6}),
      Workdir(str(trained)),
      str(tmp_path / "refused"),
    )
  assert config_lib.user_message(refused.value) == (
    "config.model.norm_epsilon=1e-06: a Marian model needs norm_epsilon = 1e-05"
  )
  assert not (tmp_path / "refused").exists()


def config_of_flags(shared, overrides):
  """The config that `helpers.flags(shared, **overrides)` gives on the command line."""
  argv, values = ["test", *helpers.flags(shared, **overrides)], absl_flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
  values(argv)
  return config_lib.parse(values.config)


@pytest.mark.parametrize(
  "overrides, field",
  [
    (dict(norm="pre"), "norm"),
    (dict(positional="learned"), "positional"),
    (dict(d_k=4), "d_k"),
    (dict(d_v=4), "d_v"),
    (dict(norm_epsilon=1e-6), "norm_epsilon"),
    (dict(scan_layers=True), "scan_layers"),
  ],
)
def test_export_refuses_a_model_marian_cannot_represent(overrides, field):
  model = helpers.tiny_model_config(**{"norm_epsilon": 1e-5, **overrides})
  with pytest.raises(UserError, match=f"^model.{field}=.*: a Marian model needs"):
    marian.marian_config(model, vocab_size=model.vocab_size, pad_id=9, eos_id=0)


def test_the_dropout_rates_and_the_depths_go_to_marian_and_back():
  model = helpers.tiny_model_config(
    norm_epsilon=1e-5,
    dropout_rate=0.2,
    attention_dropout_rate=0.1,
    activation_dropout_rate=0.3,
    num_layers=3,
    num_decoder_layers=1,
  )
  config = marian.marian_config(model, vocab_size=model.vocab_size, pad_id=9, eos_id=0)
  assert (config["dropout"], config["attention_dropout"], config["activation_dropout"]) == (
    0.2,
    0.1,
    0.3,
  )
  assert (config["encoder_layers"], config["decoder_layers"]) == (3, 1)
  names = {0: "</s>", 9: "<pad>"}
  vocab = {names.get(i, f"p{i}"): i for i in range(model.vocab_size)}
  fields = marian.model_fields(config, vocab)
  rates = ("dropout_rate", "attention_dropout_rate", "activation_dropout_rate")
  assert [fields[name] for name in rates] == [0.2, 0.1, 0.3]
  assert (fields["num_layers"], fields["num_decoder_layers"]) == (3, 1)
  del config["decoder_layers"]
  with pytest.raises(UserError, match=r"^config.json.decoder_layers is missing$"):
    marian.model_fields(config, vocab)


def test_the_weights_of_a_deeper_encoder_go_to_marian_and_back_bit_identical():
  model = helpers.tiny_model_config(
    attention_bias=True, logits_bias=True, num_layers=3, num_decoder_layers=1
  )
  ids = np.ones((1, 3), np.int32)
  shapes = helpers.init_module(Transformer(model), ids, ids)[1]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), shapes)
  order = rng.permutation(model.vocab_size)
  depths = (3, 1)
  state = weights.to_state(
    params,
    depths=depths,
    num_heads=model.num_heads,
    token_order=order,
    attention_bias=True,
    logits_bias=True,
  )
  assert "model.encoder.layers.2.fc1.weight" in state
  assert "model.decoder.layers.0.encoder_attn.q_proj.weight" in state
  assert not any(name.startswith("model.decoder.layers.1.") for name in state)
  back = weights.to_params(state, depths=depths, num_heads=model.num_heads, token_order=order)
  for want, got in zip(helpers.leaves(params), helpers.leaves(back), strict=True):
    np.testing.assert_array_equal(got, want)


def edited_copy(source, target, **config_changes):
  """A copy of Marian directory `source` with `config_changes` made to its config.json."""
  shutil.copytree(source, target)
  config = json.loads((target / "config.json").read_text())
  (target / "config.json").write_text(json.dumps({**config, **config_changes}))
  return target


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(decoder_ffn_dim=64), "config.json.decoder_ffn_dim=64 differs from encoder_ffn_dim=32"),
    (
      dict(share_encoder_decoder_embeddings=False),
      "config.json.share_encoder_decoder_embeddings=False: only models with embeddings shared",
    ),
    (dict(scale_embedding=False), "config.json.scale_embedding=False"),
    (dict(activation_function="tanh"), "config.json.activation_function='tanh' is not one of"),
    (dict(decoder_start_token_id=0), "config.json.decoder_start_token_id=0; vocab.json says"),
    (dict(vocab_size=7), "config.json.vocab_size=7"),
  ],
)
def test_import_refuses_what_it_cannot_represent_naming_the_field(
  imported, tmp_path, changes, message
):
  source = edited_copy(imported[2].parent / "marian", tmp_path / "marian", **changes)
  with pytest.raises(UserError, match=re.escape(message)):
    convert.import_marian(str(source), Workdir(str(tmp_path / "work")))


def edited_generation(source, target, remove=(), **changes):
  """A copy of Marian directory `source` with `changes` made to its generation_config.json and
  the fields `remove` removed."""
  shutil.copytree(source, target)
  path = target / "generation_config.json"
  settings = {**json.loads(path.read_text()), **changes}
  path.write_text(json.dumps({k: v for k, v in settings.items() if k not in remove}))
  return target


@pytest.mark.parametrize(
  "changes, field",
  [
    (dict(do_sample=True), "do_sample"),
    (dict(no_repeat_ngram_size=3), "no_repeat_ngram_size"),
    (dict(num_return_sequences=2), "num_return_sequences"),
    (dict(min_length=5), "min_length"),
    (dict(repetition_penalty=1.2), "repetition_penalty"),
    (dict(bad_words_ids=[[5]]), "bad_words_ids"),
    (dict(forced_eos_token_id=5), "forced_eos_token_id"),
    (dict(length_penalty=-1.0), "length_penalty"),
    (dict(forced_bos_token_id=0), "forced_bos_token_id"),
    (dict(num_beam_groups=2), "num_beam_groups"),
    (dict(dola_layers="high"), "dola_layers"),
    (dict(remove=["bad_words_ids"]), "bad_words_ids"),
  ],
)
def test_import_refuses_generation_settings_the_decoder_does_not_reproduce(
  imported, tmp_path, changes, field
):
  source = edited_generation(imported[2].parent / "marian", tmp_path / "marian", **changes)
  with pytest.raises(UserError, match=re.escape(f"generation_config.json.{field}=")):
    convert.import_marian(str(source), Workdir(str(tmp_path / "work")))


@pytest.mark.parametrize(
  "changes, decode",
  [
    (dict(max_new_tokens=9), dict(max_length=10)),
    (dict(remove=["max_length"]), dict(max_length=21)),  # Hugging Face's 20 new tokens.
    (
      dict(remove=["forced_eos_token_id", "renormalize_logits"], length_penalty=0.5),
      dict(force_eos=False, renormalize=False, alpha=0.5),
    ),
    (dict(), dict(beam_size=4, early_stopping="heuristic", force_eos=True, renormalize=True)),
    (dict(early_stopping=True), dict(early_stopping="first_k")),
    (dict(early_stopping="never"), dict(early_stopping="exact")),
    (
      dict(length_penalty=None, early_stopping=None, min_length=None),  # null: the default.
      dict(alpha=1.0, early_stopping="heuristic"),
    ),
    (dict(remove=["num_beams"]), dict(beam_size=1, early_stopping="exact")),
  ],
)
def test_import_maps_the_generation_settings(imported, tmp_path, changes, decode):
  source = edited_generation(imported[2].parent / "marian", tmp_path / "marian", **changes)
  result = convert.import_marian(str(source), Workdir(str(tmp_path / "work")))
  config = config_lib.load_file(result["config"])
  assert {name: config.decode[name] for name in decode} == decode
  assert config.decode.max_extra == config.model.max_len  # No source-relative limit.


def test_import_reads_the_generation_settings_of_config_json_without_generation_config_json(
  imported, tmp_path
):
  """Older OPUS-MT models keep their generation settings in config.json."""
  source = edited_copy(
    imported[2].parent / "marian",
    tmp_path / "marian",
    num_beams=6,
    max_length=30,
    bad_words_ids=[[imported[0].config.pad_token_id]],
  )
  (source / "generation_config.json").unlink()
  result = convert.import_marian(str(source), Workdir(str(tmp_path / "work")))
  config = config_lib.load_file(result["config"])
  assert (config.decode.beam_size, config.decode.max_length, config.decode.force_eos) == (
    6,
    30,
    True,
  )


@pytest.mark.slow
def test_import_errors_on_the_command_line_are_one_line(imported, shared, tmp_path):
  source = tmp_path / "marian"
  shutil.copytree(imported[2].parent / "marian", source)
  (source / "target.spm").unlink()
  error = cli(
    shared,
    "transformer_jax.pretrained",
    "import",
    f"--marian={source}",
    f"--workdir={tmp_path / 'work'}",
    status=1,
  )
  assert error.strip().splitlines()[-1] == f"error: {source} lacks the tokenizer files target.spm"
  assert "Traceback" not in error
  with pytest.raises(UserError) as exists:
    convert.import_marian(str(source), Workdir(str(imported[2])))
  assert str(exists.value) == f"{imported[2] / 'checkpoints'} exists: import into a new --workdir"


def test_pytorch_bin_imports_like_safetensors_and_needs_torch(imported, tmp_path, monkeypatch):
  hf, _, workdir, config = imported
  source = tmp_path / "marian"
  shutil.copytree(workdir.parent / "marian", source)
  (source / "model.safetensors").unlink()
  torch.save(hf.state_dict(), source / "pytorch_model.bin")
  convert.import_marian(str(source), Workdir(str(tmp_path / "work")))
  got = host_params(
    tmp_path / "work", config_lib.parse(config_lib.load_file(str(tmp_path / "work" / "config.py")))
  )
  for want, leaf in zip(
    helpers.leaves(host_params(workdir, config)), helpers.leaves(got), strict=True
  ):
    np.testing.assert_array_equal(leaf, want)
  monkeypatch.setitem(sys.modules, "torch", None)  # As if PyTorch were not installed.
  with pytest.raises(
    UserError,
    match="is a PyTorch file and PyTorch is not installed: pip "
    "install torch, or get the model.safetensors",
  ):
    convert.import_marian(str(source), Workdir(str(tmp_path / "other")))


@pytest.mark.slow
def test_fine_tuning_an_imported_model_through_the_command_line_lowers_the_loss_and_resumes(
  imported, shared, corpus, tmp_path
):
  workdir = tmp_path / "work"
  shutil.copytree(imported[2], workdir)  # The config finds its tokenizer wherever it is.
  train = [
    "transformer_jax.main",
    f"--config={workdir}/config.py",
    f"--workdir={workdir}",
    "--mode=train",
    *data_flags(
      shared,
      data__batch__mode="packed",
      data__batch__size=8,
      data__batch__max_length=64,
      data__batch__max_source_length=64,
      data__batch__max_target_length=64,
      warmup_steps=4,
      log_every_steps=1,
      checkpoint_every_steps=4,
      peak_flops_per_device=1e9,
      eval_every_steps=0,
    ),
  ]
  cli(shared, *train, "--config.num_train_steps=8")
  losses = helpers.scalars(workdir)
  assert sorted(losses) == list(range(1, 9))
  assert losses[8] < 0.8 * losses[1], losses
  assert helpers.committed_steps(workdir) == [0, 4, 8]
  cli(shared, *train, "--config.num_train_steps=10")
  assert sorted(helpers.scalars_per_run(workdir)[-1]) == [9, 10]  # Resumed at step 8.
  assert helpers.committed_steps(workdir)[-1] == 10

  exported = tmp_path / "exported"  # The fine-tuned model, with the Marian tokenizer it came with.
  config = config_lib.parse(config_lib.load_file(str(workdir / "config.py")))
  convert.export_marian(config, Workdir(str(workdir)), str(exported))
  for name in marian_vocab.FILES:
    assert (exported / name).read_bytes() == (imported[2] / "vocab" / "marian" / name).read_bytes()
  hf = transformers.MarianMTModel.from_pretrained(str(exported)).eval()
  hf_tokenizer = transformers.MarianTokenizer.from_pretrained(str(exported))
  reimported = generation.decode_fields(
    json.loads((exported / "generation_config.json").read_text()),
    pad_id=hf.config.pad_token_id,
    eos_id=0,
    positions=config.model.max_len,
  )
  assert reimported == {name: getattr(config.decode, name) for name in reimported}
  assert logits_difference(hf, hf_tokenizer, workdir, config, corpus[0][:4], corpus[1][:4]) <= 1e-5
