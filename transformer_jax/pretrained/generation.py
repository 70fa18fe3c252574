"""Hugging Face's generation settings (`generation_config.json`) to `config.decode` and back.

`decode_fields` maps what `MarianMTModel.generate` would do with a model's
generation settings onto the one decoder here: the beam size, the length
rule (`max_length` counts the decoder's start token; `max_new_tokens` wins
over it; neither means 20 new tokens), the forced EOS at that cap,
renormalized log-probabilities and the `len ** length_penalty`
normalization and the beam search's stopping rule. A setting that would
change the output and that the decoder does not reproduce is refused with a
MarianError naming it.
"""

from transformer_jax.pretrained.marian import MarianError

FILE = "generation_config.json"
DEFAULT_NEW_TOKENS = 20  # Hugging Face's output length when no maximum is set.
# Hugging Face's early_stopping values and the beam search's stopping rules they name.
EARLY_STOPPING = {"never": "exact", False: "heuristic", True: "first_k"}
_HF_EARLY_STOPPING = {rule: value for value, rule in EARLY_STOPPING.items()}

# Settings that change the output, with the values that leave it alone ((): none does).
_REFUSED = {
  "do_sample": ((False,), "sampling"),
  "num_beam_groups": ((1,), "diverse beam search"),
  "diversity_penalty": ((0,), "diverse beam search"),
  "num_return_sequences": ((1,), "several outputs per input"),
  "min_length": ((0, 1), "a minimum length"),  # 1: the decoder's start token.
  "min_new_tokens": ((0,), "a minimum length"),
  "repetition_penalty": ((1,), "a repetition penalty"),
  "encoder_repetition_penalty": ((1,), "a repetition penalty"),
  "no_repeat_ngram_size": ((0,), "n-gram blocking"),
  "encoder_no_repeat_ngram_size": ((0,), "n-gram blocking"),
  "suppress_tokens": (([],), "suppressed tokens"),
  "begin_suppress_tokens": (([],), "suppressed tokens"),
  "forced_bos_token_id": ((), "a forced first token"),
  "forced_decoder_ids": (([],), "forced tokens"),
  "sequence_bias": (({}, []), "sequence biases"),
  "exponential_decay_length_penalty": ((), "a length-dependent EOS bonus"),
  "force_words_ids": (([],), "constrained beam search"),
  "constraints": (([],), "constrained beam search"),
  "penalty_alpha": ((0,), "contrastive search"),
  "dola_layers": ((), "DoLa decoding"),
  "guidance_scale": ((1,), "classifier-free guidance"),
  "max_time": ((), "a time limit"),
  "stop_strings": (([],), "stop strings"),
  "watermarking_config": ((), "watermarking"),
}


def _refuse(field: str, detail: str) -> MarianError:
  return MarianError(f"{FILE}.{field}{detail}")


def decode_fields(generation: dict, *, pad_id: int, eos_id: int, positions: int) -> dict:
  """The `config.decode` fields for the generation settings `generation` of a model whose
  token ids are Marian's `pad_id` and `eos_id` and which has `positions` positions.

  The output cap is `max_length` counted as Hugging Face counts it (and no
  source-relative limit: `max_extra` is set to `positions`). Raises
  MarianError (naming the field of generation_config.json) for a setting the decoder does
  not reproduce.
  """
  generation = {name: value for name, value in generation.items() if value is not None}
  for field, (neutral, what) in _REFUSED.items():
    if field in generation and generation[field] not in neutral:
      raise _refuse(
        field,
        f"={generation[field]!r}: {what} is not supported by this decoder; "
        "remove the setting (or set it to its default) to import the model",
      )
  eos = generation.get("eos_token_id", eos_id)
  if eos not in (eos_id, [eos_id]):
    raise _refuse("eos_token_id", f"={eos!r}; the tokenizer's EOS is {eos_id}")
  for field in ("decoder_start_token_id", "pad_token_id"):
    if generation.get(field, pad_id) != pad_id:
      raise _refuse(
        field, f"={generation[field]!r}; this model starts from and pads with <pad> ({pad_id})"
      )
  if generation.get("bad_words_ids") != [[pad_id]]:
    raise _refuse(
      "bad_words_ids",
      f"={generation.get('bad_words_ids')!r}: only [[{pad_id}]] "
      "(<pad>, which this decoder never emits) is supported",
    )
  forced = generation.get("forced_eos_token_id")
  if forced not in (None, eos_id, [eos_id]):
    raise _refuse(
      "forced_eos_token_id", f"={forced!r}; only the EOS token ({eos_id}) may be forced"
    )
  penalty = generation.get("length_penalty", 1.0)
  if not isinstance(penalty, (int, float)) or isinstance(penalty, bool) or penalty < 0:
    raise _refuse("length_penalty", f"={penalty!r}: only a number >= 0 is supported")
  beams = generation.get("num_beams") or 1
  if not isinstance(beams, int) or beams < 1:
    raise _refuse("num_beams", f"={beams!r} is not a positive integer")
  if generation.get("max_new_tokens") is not None:
    max_length = generation["max_new_tokens"] + 1
  elif generation.get("max_length") is not None:
    max_length = generation["max_length"]
  else:
    max_length = min(DEFAULT_NEW_TOKENS + 1, positions)
  if not isinstance(max_length, int) or max_length < 2:
    raise _refuse("max_length", f"={max_length!r}: an output needs at least one token (>= 2)")
  early = generation.get("early_stopping", False)
  if early not in EARLY_STOPPING:
    raise _refuse("early_stopping", f"={early!r} is not one of True, False, 'never'")
  return {
    "beam_size": beams,
    "alpha": float(penalty),
    "length_normalization": "length",
    "max_extra": positions,
    "max_length": max_length,
    "force_eos": forced is not None,
    "renormalize": bool(generation.get("renormalize_logits")),
    # Greedy decoding has no early stopping; the default keeps exports' round trips exact.
    "early_stopping": EARLY_STOPPING[early] if beams > 1 else "exact",
  }


def generation_config(decode, *, pad_id: int, eos_id: int, positions: int) -> dict:
  """`generation_config.json` for decoding as `decode` (a `DecodeSettings`) does, as far as
  Hugging Face can express it: without `max_length` the cap is the model's `positions` tokens
  (`max_length` = positions + 1; the source + `max_extra` rule has no Hugging Face
  equivalent), and the GNMT penalty is written as the default `len ** 1`."""
  config = {
    "decoder_start_token_id": pad_id,
    "pad_token_id": pad_id,
    "eos_token_id": eos_id,
    "bad_words_ids": [[pad_id]],
    "num_beams": decode.beam_size,
    "max_length": decode.max_length or positions + 1,
    "renormalize_logits": decode.renormalize,
  }
  if decode.beam_size > 1:
    config["early_stopping"] = _HF_EARLY_STOPPING[decode.early_stopping]
  if decode.force_eos:
    config["forced_eos_token_id"] = eos_id
  if decode.length_normalization == "length":
    config["length_penalty"] = decode.alpha
  return config
