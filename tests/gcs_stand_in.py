"""The tests' Google Cloud Storage server: gcp-storage-emulator, with what TensorStore's
conditional writes (Orbax's OCDBT checkpoints) need and it lacks. Importing this module gives
its routes these two behaviours of the real service:

- an object's content and metadata carry its generation in `x-goog-generation` (without it,
  TensorStore reads every generation as empty: "Malformed StorageGeneration");
- an upload or a deletion with `ifGenerationMatch` is refused (412) unless the object's
  generation is that one (0: the object must not exist), checked when the upload starts (the
  server answers one request at a time, so nothing comes between the check and the write);
- `moveTo` moves an object (as a copy and a delete here; Orbax renames a checkpoint it deletes,
  and gcsfs retried the emulator's 501 for about 25 s before copying).

Where it is less than the real service: the precondition is checked when an upload starts, not
when it ends, and only for an object named in the query string (TensorStore's uploads; not a
multipart or resumable upload that names it in its body, nor the emulator's fallback for
uploads posted without `/upload`).
"""

from http import HTTPStatus

from gcp_storage_emulator import server as emulator
from gcp_storage_emulator import settings
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def _generation(storage, bucket: str, name: str) -> str:
  """The object's generation, "0" when there is none."""
  try:
    return str(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    return "0"


def _with_generation(read):
  def handler(request, response, storage, *args, **kwargs):
    read(request, response, storage, *args, **kwargs)
    params = request.params
    if "object_id" in params:
      response["x-goog-generation"] = _generation(
        storage, params["bucket_name"], params["object_id"]
      )

  return handler


def _if_generation_matches(write):
  def handler(request, response, storage, *args, **kwargs):
    wanted = request.query.get("ifGenerationMatch")
    name = request.params.get("object_id") or (request.query.get("name") or [None])[0]
    if wanted and name and _generation(storage, request.params["bucket_name"], name) != wanted[0]:
      response.status = HTTPStatus.PRECONDITION_FAILED
      response.json({"error": {"code": 412, "message": "Precondition Failed"}})
      return None
    return write(request, response, storage, *args, **kwargs)

  return handler


def _move(request, response, storage, *args, **kwargs):
  params = request.params
  bucket, source, target = params["bucket_name"], params["object_id"], params["dest_object_id"]
  try:
    moved = objects._copy(request.base_url, storage, bucket, source, bucket, target)
    storage.delete_file(bucket, source)
    response.json(moved)
  except NotFound:
    response.status = HTTPStatus.NOT_FOUND


_MOVE = (
  rf"^{settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)"
  r"/moveTo/o/(?P<dest_object_id>.*[^/]+)$",
  {emulator.POST: _move},
)
_REPLACED = {
  objects.get: _with_generation(objects.get),
  objects.download: _with_generation(objects.download),
  objects.insert: _if_generation_matches(objects.insert),
  objects.delete: _if_generation_matches(objects.delete),
}
emulator.HANDLERS = (_MOVE,) + tuple(
  (route, {method: _REPLACED.get(handler, handler) for method, handler in methods.items()})
  for route, methods in emulator.HANDLERS
)
create_server = emulator.create_server
