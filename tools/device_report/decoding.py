"""Stage e, decoding: beam search (beam 4, alpha 0.6) and greedy decoding of `base` with random
parameters, every output forced to the plan's length; sentences/s and tokens/s over the median of
the timed calls, the first call (compile included) apart."""

from tools import decode_benchmark
from tools.device_report.speed import experiment_of
from transformer_jax.experiment import make_trainer


def run(plan, step, result, context) -> None:
  del step, context
  experiment = experiment_of(*plan.variants["base"])
  trainer, _ = make_trainer(experiment, vocab_size=experiment.data.vocab.size)
  times = decode_benchmark.measure_decoding(
    trainer.placement.model,
    trainer.init().params,
    plan.decode_runs,
    sentences=plan.decode_sentences,
    source_length=plan.decode_source_length,
    output_length=plan.decode_output_length,
  )
  searches = {}
  for name, figures in times.items():
    searches[name] = {
      "compile_and_first_seconds": figures["first"],
      "seconds": {k: figures[k] for k in ("median", "min", "max")},
      "sentences_per_second": plan.decode_sentences / figures["median"],
      "tokens_per_second": (plan.decode_sentences * plan.decode_output_length / figures["median"]),
    }
  result.put(
    model="base",
    sentences=plan.decode_sentences,
    source_length=plan.decode_source_length,
    output_length=plan.decode_output_length,
    alpha=0.6,
    runs=plan.decode_runs,
    searches=searches,
    attention=trainer.placement.model.config.attention_impl,
  )
