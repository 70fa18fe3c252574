"""Import a Marian (OPUS-MT) directory into a work directory, and export one back.

`import_marian(source, workdir)` writes
  <workdir>/config.py          the experiment: the model's architecture, its tokenizer, its
                               generation settings; `--config=<workdir>/config.py`
  <workdir>/vocab/marian/      source.spm, target.spm, vocab.json (`data.vocab.path`)
  <workdir>/checkpoints/0/     the parameters, a params-only checkpoint at step 0
Every mode of `transformer_jax.main` then uses the work directory as is:
translate and eval read step 0 as `--checkpoint=latest`, and train starts
from it (a fresh optimizer, step 0) and writes its checkpoints beside it.
The source, the work directory and an export's output may each be a local
directory or a URL (gs://...). In a bucket, config.py names the vocabulary by
its URL, since `--config` reads a local file: a copy of config.py.

`export_marian(experiment, workdir, output)` writes a Marian directory that
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load.
"""

import json
import os

import jax
import numpy as np
import safetensors.numpy
import sentencepiece as spm
from etils import epath

from transformer_jax import fileio
from transformer_jax.checkpoints import store
from transformer_jax.data import marian as marian_vocab
from transformer_jax.experiment import Checkpoint, Experiment, load
from transformer_jax.model.config import TransformerConfig, preset_fields
from transformer_jax.placement import Placement
from transformer_jax.pretrained import generation, marian, weights
from transformer_jax.workdir import Workdir

_CONFIG_TEMPLATE = '''"""A Marian model imported from {source}.

Use: {usage}; override any field with --config.<field>=<value>
(the data to fine-tune on: --config.data.source.name=text
--config.data.source.text_train=PREFIX ...).
"""

import os

from transformer_jax import config as config_lib

MODEL = {model!r}
DECODE = {decode!r}


def get_config():
  config = config_lib.default_config()
  config.model = config_lib.model_fields("base", **MODEL)
  config.data.vocab.path = {vocab_path}
  config.data.vocab.size = {vocab_size}
  for field in ("max_source_length", "max_target_length", "max_length"):  # Within the positions.
    config.data.batch[field] = min(config.data.batch[field], MODEL["max_len"])
  config.decode.update(DECODE)
  return config
'''


def usage(config_file: str, workdir: str) -> str:
  """The flags of `transformer_jax.main` for an imported work directory: its config.py, a copy
  on the local disk where the work directory is in a bucket (`--config` reads a local file)."""
  config = f"<a local copy of {config_file}>" if fileio.is_url(config_file) else config_file
  return f"--config={config} --workdir={workdir}"


def _vocab_path_code(vocab_dir: str, root: str) -> str:
  """The Python expression of `data.vocab.path` in the config.py of `root`: on the local disk,
  `vocab_dir` beside that file, wherever the work directory moves; in a bucket, the URL itself,
  which any copy of the file (`--config` reads a local one) then names."""
  if fileio.is_url(root):
    return repr(vocab_dir)
  parts = ", ".join(map(repr, os.path.relpath(vocab_dir, root).split(os.sep)))
  return f"os.path.join(os.path.dirname(os.path.abspath(__file__)), {parts})"


def import_marian(source: str, workdir: Workdir) -> dict:
  """Convert the Marian directory `source` into work directory `workdir` (see the module doc).

  Returns `{"config": path of the experiment file, "parameters": count}`.
  The decoding settings come from `generation_config.json` (else from the
  generation settings of `config.json`, as Hugging Face reads an older
  model), mapped by `generation.decode_fields`. Raises a UserError
  (naming the field of config.json or generation_config.json) for a model or
  a generation setting this project cannot represent, files that are missing
  or unreadable, or a work directory that already has checkpoints.
  """
  if epath.Path(workdir.checkpoints).exists():
    raise marian.MarianError(f"{workdir.checkpoints} exists: import into a new --workdir")
  vocab = marian.read_tokenizer(source)
  hf_config = marian.read_json(os.path.join(source, "config.json"))
  fields = marian.model_fields(hf_config, vocab)
  model = TransformerConfig(vocab_size=len(vocab), **preset_fields("base", **fields))
  decode = generation.decode_fields(
    marian.read_json(os.path.join(source, generation.FILE), default=hf_config),
    pad_id=vocab["<pad>"],
    eos_id=vocab["</s>"],
    positions=fields["max_len"],
  )
  state = marian.read_state(source)
  state[weights.EMBEDDING] = marian.shared_embedding(state)
  state.setdefault(weights.LOGITS_BIAS, np.zeros((1, len(vocab)), np.float32))
  try:
    params = weights.to_params(
      state,
      depths=model.depths,
      num_heads=model.num_heads,
      token_order=marian_vocab.project_order(vocab),
    )
  except KeyError as error:
    raise marian.MarianError(f"the weights of {source} lack {error}") from None
  workdir.create()
  vocab_dir = workdir.marian_vocab
  for name in marian_vocab.FILES:
    content = epath.Path(source, name).read_bytes()
    fileio.write_atomically(os.path.join(vocab_dir, name), content)
  config_file = workdir.imported_config
  fileio.write_atomically(
    config_file,
    _CONFIG_TEMPLATE.format(
      source=fileio.absolute(source),
      usage=usage(config_file, workdir.root),
      model=fields,
      decode=decode,
      vocab_path=_vocab_path_code(vocab_dir, workdir.root),
      vocab_size=len(vocab),
    ),
  )
  placement = Placement.data_parallel(model)
  placed = jax.device_put(params, placement.param_shardings)
  manager = store.make_params_manager(workdir.checkpoints)
  store.save_params(manager, 0, placed, imported_from=fileio.absolute(source))
  manager.close()
  return {
    "config": config_file,
    "parameters": sum(int(x.size) for x in jax.tree_util.tree_leaves(params)),
  }


def export_marian(
  experiment: Experiment, workdir: Workdir, output: str, checkpoint: Checkpoint = Checkpoint()
) -> dict:
  """Write the model of `workdir` (the parameters `checkpoint` names) as a Marian directory.

  A work directory trained with the project's own SentencePiece vocabulary
  gets that model as both `source.spm` and `target.spm` and a `vocab.json` in
  Marian's order. Raises FieldError naming a model field Marian cannot
  represent (a language model: `model_kind`). Single-process only (it gathers the parameters on
  this host).
  """
  experiment.refuse_for_language_model("export to Marian")
  loaded = load(experiment, workdir, checkpoint)
  model = loaded.placement.model.config
  tokenizer = loaded.tokenizer
  files = tokenizer_files(tokenizer)
  vocab = json.loads(files["vocab.json"])
  order = marian_vocab.project_order(vocab)
  hf_config = marian.marian_config(
    model, vocab_size=len(vocab), pad_id=vocab["<pad>"], eos_id=vocab["</s>"]
  )
  params = jax.device_get(loaded.params)
  state = weights.to_state(
    params,
    depths=model.depths,
    num_heads=model.num_heads,
    token_order=order,
    attention_bias=model.attention_bias,
    logits_bias=model.logits_bias,
  )
  epath.Path(output).mkdir(parents=True, exist_ok=True)
  fileio.write_atomically(
    os.path.join(output, marian.SAFETENSORS),
    safetensors.numpy.save(state, metadata={"format": "pt"}),
  )
  fileio.write_json(os.path.join(output, "config.json"), hf_config)
  fileio.write_json(
    os.path.join(output, generation.FILE),
    generation.generation_config(
      experiment.decode,
      pad_id=hf_config["pad_token_id"],
      eos_id=hf_config["eos_token_id"],
      positions=model.max_len,
    ),
  )
  for name, content in files.items():
    fileio.write_atomically(os.path.join(output, name), content)
  fileio.write_json(
    os.path.join(output, "tokenizer_config.json"),
    {
      "tokenizer_class": "MarianTokenizer",
      "model_max_length": model.max_len,
      "separate_vocabs": False,
    },
  )
  return {"directory": output, "checkpoint": loaded.name}


def tokenizer_files(tokenizer) -> dict[str, bytes]:
  """`source.spm`, `target.spm` and `vocab.json` of a tokenizer: a Marian one's own files; for a
  single SentencePiece model, that model on both sides and its pieces numbered as Marian numbers
  them (eos 0, unk 1, the rest in order, pad last)."""
  if isinstance(tokenizer, marian_vocab.MarianTokenizer):
    return dict(tokenizer.files)
  processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
  size = processor.get_piece_size()
  # Marian's id of each of our ids: pad last, then eos 0, unk 1, and the rest after them.
  marian_ids = [size - 1, 0, 1] + list(range(2, size - 1))
  vocab = {processor.id_to_piece(i): marian_ids[i] for i in range(size)}
  content = json.dumps(vocab, ensure_ascii=False, indent=0).encode("utf-8")
  return {
    "source.spm": tokenizer.model_proto,
    "target.spm": tokenizer.model_proto,
    "vocab.json": content,
  }
