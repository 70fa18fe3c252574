"""The tests' Google Cloud Storage server: gcp-storage-emulator, with what TensorStore's
conditional writes (Orbax's OCDBT checkpoints) need and it lacks, and with buckets that refuse
their callers. Importing this module gives its routes these behaviours of the real service:

- an object's content and metadata carry its generation in `x-goog-generation` (without it,
  TensorStore reads every generation as empty: "Malformed StorageGeneration");
- an upload or a deletion with `ifGenerationMatch` is refused (412) unless the object's
  generation is that one (0: the object must not exist), checked when the upload starts (the
  server answers one request at a time, so nothing comes between the check and the write);
- `moveTo` moves an object (as a copy and a delete here; Orbax renames a checkpoint it deletes,
  and gcsfs retried the emulator's 501 for about 25 s before copying);
- two buckets answer as the service answers a caller it refuses, with its JSON error body
  (`{"error": {"code", "message", "errors": [...]}}`): every request for `NO_CREDENTIALS_BUCKET`
  answers 401 as to a caller without credentials, and `READ_ONLY_BUCKET` (made on its first
  request, empty) may be read and listed while every other request (a write, a deletion, a
  change of metadata) answers 403 as to an account that may only read it.

Where it is less than the real service: the precondition is checked when an upload starts, not
when it ends, and only for an object named in the query string (TensorStore's uploads; not a
multipart or resumable upload that names it in its body, nor the emulator's fallback for
uploads posted without `/upload`); the special buckets do not refuse a batch request (gcsfs's
deletion of several objects at once, which names its buckets in its body) nor an upload posted
without `/upload`.
"""

from http import HTTPStatus

from gcp_storage_emulator import server as emulator
from gcp_storage_emulator import settings
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects

NO_CREDENTIALS_BUCKET = "tjtest-noauth"
READ_ONLY_BUCKET = "tjtest-readonly"
READER = "reader@tjtest.iam.gserviceaccount.com"  # The account the 403s name.


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


def _error(response, status: HTTPStatus, message: str, reason: str, **where) -> None:
  """The service's JSON error body, in the shape Google documents. The messages (`_denial`) and
  reasons are written from memory of what the service sends, not checked against its documents
  (which could not be searched when this was written): the tests match only their gist."""
  response.status = status
  response.json(
    {
      "error": {
        "code": status.value,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason, **where}],
      }
    }
  )


def _denial(caller: str, request) -> str:
  """The service's message refusing `caller` what `request` asks: the IAM permission it checks
  (roughly, by the method and whether the request names an object) and what it names."""
  params = request.params or {}
  if "object_id" in params:
    verb = {"GET": "get", "DELETE": "delete", "PATCH": "update"}.get(request.method, "create")
    permission, what = f"storage.objects.{verb}", "object"
  elif request.path.endswith("/o"):  # A listing, or an upload naming its object in the query.
    listing = request.method == "GET"
    permission = "storage.objects.list" if listing else "storage.objects.create"
    what = "bucket" if listing else "object"
  else:
    verb = {"GET": "get", "DELETE": "delete"}.get(request.method, "update")
    permission, what = f"storage.buckets.{verb}", "bucket"
  return (
    f"{caller} does not have {permission} access to the Google Cloud Storage {what}. "
    f"Permission '{permission}' denied on resource (or it may not exist)."
  )


def _as_the_service_refuses(handler):
  """`handler`, unless its request names a bucket the service refuses (see the docstring)."""

  def refused(request, response, storage, *args, **kwargs):
    params = request.params or {}
    named = {params.get("bucket_name"), params.get("dest_bucket_name")}
    if NO_CREDENTIALS_BUCKET in named:
      return _error(
        response,
        HTTPStatus.UNAUTHORIZED,
        _denial("Anonymous caller", request),
        "required",
        locationType="header",
        location="Authorization",
      )
    if READ_ONLY_BUCKET in named:
      buckets.create_bucket(READ_ONLY_BUCKET, storage)  # Nothing if it is there.
      if request.method != "GET" or params.get("dest_bucket_name") == READ_ONLY_BUCKET:
        return _error(response, HTTPStatus.FORBIDDEN, _denial(READER, request), "forbidden")
    return handler(request, response, storage, *args, **kwargs)

  return refused


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
emulator.HANDLERS = tuple(
  (
    route,
    {
      method: _as_the_service_refuses(_REPLACED.get(handler, handler))
      for method, handler in methods.items()
    },
  )
  for route, methods in ((_MOVE,) + emulator.HANDLERS)
)
create_server = emulator.create_server
