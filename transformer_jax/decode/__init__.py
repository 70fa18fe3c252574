"""Decoding and scoring: the searches, batched translation, and the metrics.

search.py      greedy decoding and beam search with a key/value cache, one jitted while_loop
cache.py       the decoder's cache: made once per batch, one token per step, beams reordered
translator.py  Translator: lines -> length-sorted, sharded batches -> search -> lines in order
metrics.py     BLEU (sacrebleu; paper-style tokenized; as is), teacher-forced loss and perplexity
"""
