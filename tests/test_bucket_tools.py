"""The tools beside training with a work directory in a bucket (the tests' GCS server,
`gcs_stand_in`): `--mode=compile` writes its report there, and a Marian model imported there
translates through the command line as Hugging Face's does; an export into the bucket imports
back from it bit for bit."""

import json

import jax
import numpy as np
import pytest
from etils import epath

import helpers
from transformer_jax import config as config_lib
from transformer_jax import data
from transformer_jax.compile import targets
from transformer_jax.experiment import load
from transformer_jax.pretrained import convert
from transformer_jax.workdir import Workdir


def _python(shared, *arguments) -> str:
  """The stdout of `python arguments...`, which must succeed."""
  result = helpers.python(*arguments, shared=shared, timeout=600)
  assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
  return result.stdout


@pytest.mark.slow
@pytest.mark.skipif(
  not targets.installed("libtpu") or jax.default_backend() != "cpu",
  reason="needs the tpu extra (libtpu) and the CPU backend",
)
def test_compile_writes_its_report_into_a_bucket(shared, bucket_dir):
  workdir = f"{bucket_dir}/run"
  stdout = _python(
    shared,
    "-m",
    "transformer_jax.main",
    "--mode=compile",
    "--target=v5e-8",
    f"--workdir={workdir}",
    *helpers.flags(shared),
  )
  path = f"{workdir}/compile/v5e-8.json"
  assert f"report: {path}" in stdout
  record = json.loads(epath.Path(path).read_text())
  assert record["target"]["name"] == "v5e-8" and record["fits"]
  assert [p["name"] for p in record["programs"] if p["kind"] == "train"]
  assert not (helpers.REPO / "gs:").exists()  # Where a gs:// path taken as local would go.


def _local_copy(url: str, directory) -> str:
  """A copy of the file at `url` in the local `directory` (`--config` reads a local file)."""
  path = directory / url.replace("://", "_").replace("/", "_")
  path.write_bytes(epath.Path(url).read_bytes())
  return str(path)


def _params(workdir: str, directory):
  """The parameters of a work directory's latest checkpoint, with its own config.py."""
  config = config_lib.parse(config_lib.load_file(_local_copy(f"{workdir}/config.py", directory)))
  return jax.device_get(load(config, Workdir(workdir)).params)


@pytest.mark.slow
@pytest.mark.hf
@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_a_marian_model_imported_into_a_bucket_translates_as_hugging_face_and_exports_back(
  shared, tmp_path, bucket_dir
):
  """The Hugging Face directory is local (made by test_pretrained's `marian_directory`); the work
  directory, the translations and an export are in the bucket, and the export imports back from
  there with the same parameters."""
  import test_pretrained  # pylint: disable=import-outside-toplevel  # Skips without torch.

  pairs = [
    (s, t)
    for s, t in zip(*data.split_texts(helpers.tiny_data_config(shared), "train"))
    if len(s) < 40 and len(t) < 40
  ][:2000]
  corpus = [s for s, _ in pairs], [t for _, t in pairs]
  hf = test_pretrained.marian_directory(tmp_path / "marian", corpus)
  workdir = f"{bucket_dir}/imported"
  stdout = _python(
    shared,
    "-m",
    "transformer_jax.pretrained",
    "import",
    f"--marian={tmp_path / 'marian'}",
    f"--workdir={workdir}",
  )
  assert f"--config=<a local copy of {workdir}/config.py> --workdir={workdir}" in stdout
  for name in ("source.spm", "target.spm", "vocab.json"):
    stored = epath.Path(f"{workdir}/vocab/marian/{name}").read_bytes()
    assert stored == (tmp_path / "marian" / name).read_bytes()
  config_file = _local_copy(f"{workdir}/config.py", tmp_path)
  assert config_lib.load_file(config_file).data.vocab.path == f"{workdir}/vocab/marian"
  assert [p.name for p in epath.Path(f"{workdir}/checkpoints").iterdir()] == ["0"]

  sentences = corpus[0][-12:] + ["Zürich ☃"]
  (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
  _python(
    shared,
    "-m",
    "transformer_jax.main",
    f"--config={config_file}",
    f"--workdir={workdir}",
    "--mode=translate",
    f"--input={tmp_path / 'in.txt'}",
    f"--output={workdir}/out.txt",
    "--config.decode.beam_size=1",
  )
  got = epath.Path(f"{workdir}/out.txt").read_text().splitlines()
  hf_tokenizer = test_pretrained.transformers.MarianTokenizer.from_pretrained(
    str(tmp_path / "marian")
  )
  assert got == test_pretrained.hf_outputs(hf, hf_tokenizer, sentences, 1)[0]

  exported, again = f"{bucket_dir}/exported", f"{bucket_dir}/reimported"
  experiment = config_lib.parse(config_lib.load_file(config_file))
  convert.export_marian(experiment, Workdir(workdir), exported)
  convert.import_marian(exported, Workdir(again))
  original, reimported = (helpers.leaves(_params(w, tmp_path)) for w in (workdir, again))
  for a, b in zip(original, reimported, strict=True):
    np.testing.assert_array_equal(a, b)
  assert not (helpers.REPO / "gs:").exists()
