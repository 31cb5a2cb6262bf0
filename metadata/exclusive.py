"""Create a file only if it does not exist yet, atomically, on every store a job root may use.

Of several writers racing to create the same name, exactly one learns it created it (True); the
others learn it exists (False). Nothing here depends on clocks or timing for that; the lease
(`metadata.lease`) builds its generations on it. Per store:

* **Local disk**: the bytes go to a unique temporary file (fsynced), then `os.link` to the name:
  the kernel refuses a link onto an existing name (`EEXIST`), so one writer wins and the file
  appears whole. Where hard links are not supported, `open(..., "xb")` (`O_CREAT | O_EXCL`).
  A directory removed meanwhile (an emptied `_lease/`) is made again and the create retried.
* **S3 with conditional writes** (AWS since 2024, MinIO, moto, ...): one `PutObject` with
  `If-None-Match: *`, through boto3 with the credentials and endpoint of the job root's
  `pyarrow.fs.S3FileSystem` (pyarrow cannot send that header). 412 means it exists.
* **Any other store** (no conditional put through pyarrow: HDFS, GCS, in-memory, an S3 without
  conditional writes or without boto3): a claim protocol on a store whose listings show every
  completed write (S3 and GCS are strongly consistent). A writer puts a uniquely named claim
  `<name>.claim-<ms>-<token>` next to the name, then lists: if the name exists, it lost; if no
  other claim is there, it won (any later writer's listing sees its claim, or the name it then
  writes, so no two writers both see themselves alone); if a claim with a smaller token is there
  it withdraws (lost); if only larger claims are there, it waits for them to withdraw (each of
  them sees its claim and withdraws, or one already won and writes the name). Claims are
  withdrawn (deleted) by their writer; a claim left by a writer that died in between stays, and
  blocks that name: callers choose another (the lease moves to the next generation).

>>> import tempfile
>>> from pyarrow import fs
>>> d = tempfile.mkdtemp()
>>> create_exclusive(fs.LocalFileSystem(), f"{d}/g1.json", b"a")
True
>>> create_exclusive(fs.LocalFileSystem(), f"{d}/g1.json", b"b")
False
>>> open(f"{d}/g1.json", "rb").read()
b'a'
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from pyarrow import fs as pafs

__all__ = [
    "CLAIM_MARK",
    "claim_age_ms",
    "create_by_claim",
    "create_exclusive",
    "create_local",
    "s3_delete_object",
    "s3_put_if_absent",
]

#: Claims of `create_by_claim` are named `<name><CLAIM_MARK><ms>-<token>`.
CLAIM_MARK = ".claim-"
_CLAIM = re.compile(r"^(?P<name>.+)\.claim-(?P<ms>\d{13})-(?P<token>[0-9a-f]{32})$")

#: errnos of `os.link` on file systems without hard links.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})

#: How often and how long a claimant polls for larger claims to withdraw (they withdraw within
#: one listing of their own; a claimant that died leaves its claim, so the wait is bounded).
_CLAIM_POLLS = 100
_CLAIM_POLL_S = 0.02

#: Whether an S3 endpoint honours `If-None-Match: *`, by endpoint (learnt on first use).
_CONDITIONAL: dict[str, bool] = {}


def create_exclusive(
    filesystem: pafs.FileSystem, full: str, data: bytes, *, conditional: bool = True
) -> bool:
    """Create the file `full` holding `data` unless it exists: True if this call created it,
    False if it existed (or another writer won the race). `conditional=False` skips S3
    conditional writes (the claim protocol is used instead, e.g. to test it). Raises `OSError`
    when the store fails."""
    if isinstance(filesystem, pafs.LocalFileSystem):
        return create_local(full, data)
    if conditional and filesystem.type_name == "s3":
        created = s3_put_if_absent(filesystem, full, data)
        if created is not None:
            return created
    return create_by_claim(filesystem, full, data)


def create_local(full: str, data: bytes) -> bool:
    """`create_exclusive` on a local disk: fsynced temporary file, then a no-clobber link."""
    directory = os.path.dirname(full)
    for _ in range(10):
        os.makedirs(directory, exist_ok=True)
        tmp = f"{full}.tmp-{uuid.uuid4().hex}"
        try:
            try:
                with open(tmp, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.link(tmp, full)
            except FileExistsError:
                return False
            except FileNotFoundError:
                continue  # the directory was removed meanwhile: make it again
            except OSError as exc:
                if exc.errno not in _NO_HARD_LINKS:
                    raise
                return _create_local_excl(full, data)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(directory)
        return True
    raise FileNotFoundError(f"{directory} keeps disappearing while {full} is created")


def _create_local_excl(full: str, data: bytes) -> bool:
    try:
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(os.path.dirname(full))
    return True


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def s3_put_if_absent(filesystem: pafs.FileSystem, full: str, data: bytes) -> bool | None:
    """One `PutObject` with `If-None-Match: *` on the S3 store of `filesystem` (a
    `pyarrow.fs.S3FileSystem`): True if created, False if the key exists, None if boto3 is not
    installed or the store does not honour the header (then use `create_by_claim`)."""
    client, endpoint = _s3_client(filesystem)
    if client is None or _CONDITIONAL.get(endpoint) is False:
        return None
    bucket, _, key = full.lstrip("/").partition("/")
    from botocore.exceptions import ClientError

    if endpoint not in _CONDITIONAL:  # learn once, on a probe object next to the name
        _CONDITIONAL[endpoint] = _honours_if_none_match(client, bucket, key)
        if not _CONDITIONAL[endpoint]:
            return None

    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            _CONDITIONAL[endpoint] = True
            return False
        if status == 501 or code == "NotImplemented":
            _CONDITIONAL[endpoint] = False
            return None
        raise OSError(f"PutObject s3://{bucket}/{key} failed: {code or status}") from None
    except Exception as exc:  # botocore's connection errors are not OSErrors
        raise OSError(f"PutObject s3://{bucket}/{key} failed: {exc}") from None
    return True


def s3_delete_object(filesystem: pafs.FileSystem, full: str) -> bool:
    """Delete the object `full` on the S3 store of `filesystem` with one `DeleteObject`
    through boto3: True if sent, False without boto3 (then use `filesystem.delete_file`).
    pyarrow's `delete_file` would HEAD the key, delete it and PUT an empty "directory" object
    for its parent (`chk-<id>/`), one more request per file and an object left for good."""
    client, _ = _s3_client(filesystem)
    if client is None:
        return False
    bucket, _, key = full.lstrip("/").partition("/")
    try:
        client.delete_object(Bucket=bucket, Key=key)
    except Exception as exc:  # botocore's errors are not OSErrors
        raise OSError(f"DeleteObject s3://{bucket}/{key} failed: {exc}") from None
    return True


def _honours_if_none_match(client: Any, bucket: str, key: str) -> bool:
    """Whether the store refuses a second conditional put of a key (a store that ignores the
    header accepts it): tried on a probe object `<key>.probe-<token>`, deleted after."""
    from botocore.exceptions import ClientError

    probe = f"{key}.probe-{uuid.uuid4().hex}"
    try:
        client.put_object(Bucket=bucket, Key=probe, Body=b"", IfNoneMatch="*")
        try:
            client.put_object(Bucket=bucket, Key=probe, Body=b"", IfNoneMatch="*")
        except ClientError:
            return True
        return False
    except ClientError:
        return False  # not even the first one: no conditional writes here
    except Exception as exc:
        raise OSError(f"PutObject s3://{bucket}/{probe} failed: {exc}") from None
    finally:
        with contextlib.suppress(Exception):
            client.delete_object(Bucket=bucket, Key=probe)


_CLIENTS: dict[str, Any] = {}


def _s3_client(filesystem: pafs.FileSystem) -> tuple[Any, str]:
    """A boto3 client with `filesystem`'s credentials, region and endpoint (None without
    boto3), and the endpoint's name."""
    try:
        args: dict[str, Any] = filesystem.__reduce__()[1][0]
    except (AttributeError, IndexError, KeyError, TypeError):
        return None, ""
    scheme = args.get("scheme") or "https"
    endpoint = args.get("endpoint_override") or ""
    url = (endpoint if "://" in endpoint else f"{scheme}://{endpoint}") if endpoint else None
    name = f"{url or 'aws'}|{args.get('region', '')}|{args.get('access_key', '')}"
    if name in _CLIENTS:
        return _CLIENTS[name], name
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return None, name
    # pyarrow's retries (standard, 3 attempts) and its timeouts where the URI set them; else
    # seconds rather than botocore's minute: a metadata write must not outlast a checkpoint
    connect, request = args.get("connect_timeout") or -1, args.get("request_timeout") or -1
    config = Config(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=connect if connect > 0 else 5,
        read_timeout=request if request > 0 else 30,
    )
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name=args.get("region") or None,
        aws_access_key_id=args.get("access_key") or None,
        aws_secret_access_key=args.get("secret_key") or None,
        aws_session_token=args.get("session_token") or None,
        config=config,
    )
    _CLIENTS[name] = client
    return client, name


def claim_age_ms(name: str, now_ms: int) -> int | None:
    """How old the claim file `name` (a base name or path) is by the time in its name, or None
    if it is not a claim."""
    m = _CLAIM.match(posixpath.basename(name))
    return None if m is None else now_ms - int(m.group("ms"))


def create_by_claim(
    filesystem: pafs.FileSystem,
    full: str,
    data: bytes,
    *,
    now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """`create_exclusive` with claims (see the module docstring), for stores without an
    atomic create-if-absent. `now_ms` only names the claim (its age tells a stale claim)."""
    directory, base = posixpath.split(full)
    token = uuid.uuid4().hex
    claim = f"{full}{CLAIM_MARK}{now_ms():013d}-{token}"
    filesystem.create_dir(directory, recursive=True)
    with filesystem.open_output_stream(claim) as out:
        out.write(b"")
    try:
        for _ in range(_CLAIM_POLLS):
            names = {
                posixpath.basename(i.path)
                for i in filesystem.get_file_info(
                    pafs.FileSelector(directory, recursive=False, allow_not_found=True)
                )
                if i.type == pafs.FileType.File
            }
            if base in names:
                return False
            others = sorted(
                m.group("token")
                for n in names
                if (m := _CLAIM.match(n)) is not None
                and m.group("name") == base
                and m.group("token") != token
            )
            if not others:
                with filesystem.open_output_stream(full) as out:
                    out.write(data)
                return True
            if others[0] < token:
                return False  # a smaller claim goes first
            sleep(_CLAIM_POLL_S)  # only larger claims: they withdraw, or one of them won
        return False
    finally:
        with contextlib.suppress(FileNotFoundError, OSError):
            filesystem.delete_file(claim)
