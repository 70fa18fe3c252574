"""What the data pipeline, the model and the searches agree on: token ids and batch keys."""

PAD_ID = 0  # Padding, and the decoder's start token.
EOS_ID = 1  # End of sentence: appended to every source and target, where a search stops.
UNK_ID = 2  # A piece the vocabulary does not have.

# A batch is a dict of int32 `[rows, length]` arrays under these keys, in the
# order the model takes them: token ids (EOS appended, 0-padded, targets not
# shifted), segment ids (1, 2, ... per pair in a row, 0 on padding) and each
# token's position inside its pair.
BATCH_KEYS = (
  "inputs",
  "targets",
  "inputs_segmentation",
  "targets_segmentation",
  "inputs_position",
  "targets_position",
)
