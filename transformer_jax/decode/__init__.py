"""Decoding and scoring: the searches, batched translation, and the metrics.

search.py      greedy search and beam search over any model's encoder and step functions
cache.py       what a search carries per step (shared per sentence, rows per hypothesis); reorders
transformer_search.py  the Transformer's encoder and step functions; the searches over it, jitted
translator.py  Translator: lines -> length-sorted, sharded batches -> search -> lines in order
metrics.py     BLEU (sacrebleu; paper-style tokenized; as is), teacher-forced loss and perplexity
"""
