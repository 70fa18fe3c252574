"""Decoding and evaluation: searches, translation, metrics, the best checkpoint, and the CLI modes.

  search.py      greedy decoding and beam search with a key/value cache, one jitted while_loop
  translator.py  Translator: lines -> length-sorted, sharded batches -> search -> lines in order
  metrics.py     BLEU (sacrebleu; paper-style tokenized), teacher-forced loss and perplexity
  best.py        validation BLEU during training; best/ and best.json
  modes.py       a trained model from a work directory; the average, eval and translate modes
  files.py       read_lines, write_lines, write_json
"""
