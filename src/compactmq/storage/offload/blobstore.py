"""Object storage as compactmq sees it: a ``BlobStore`` of immutable objects over ``pyarrow.fs``.

One class covers every driver, because ``pyarrow.fs`` already abstracts them: ``S3FileSystem``
for ``aws-s3``/``S3`` (any S3-compatible endpoint), ``GcsFileSystem`` for
``google-cloud-storage``, ``LocalFileSystem`` or ``HadoopFileSystem`` (``hdfs://``) for
``filesystem``. A store is described by an ``OffloadLocation`` -- plain, picklable, JSON-able and
free of secrets -- which is recorded next to every offloaded object and shipped to Spark tasks, so
a reader (another process, an executor on another machine) rebuilds the same store from it.

Credentials are never part of a location and never logged: the S3 driver uses the AWS SDK's
default chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
``AWS_PROFILE`` and the shared profile files, instance roles), GCS its application-default
credentials, HDFS its Kerberos ticket cache. ``STORAGE_EMULATOR_HOST`` (the variable Google's
client libraries read) points the GCS driver at an emulator instead: that endpoint, anonymous,
recorded in the location like an S3 endpoint.

Objects are written once and never modified: a write goes to a new name, so a reader never sees
half an object (S3 and GCS publish an object when its upload completes; on a local filesystem the
bytes are fsynced before the caller commits the name in the metadata store, and a crash before
that leaves an unnamed orphan the sweep removes).

``OBJECT_COUNTERS`` counts, for the whole process, the objects every store wrote (one per
completed ``put``, whatever its retries) and deleted, and the bytes written: what ``/metrics``
exports as ``compactmq_object_store_*`` and what the cluster benchmark turns into object
writes per second.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping
from urllib.parse import parse_qs, urlencode, urlparse

from ...errors import InvalidConfiguration, StorageError

S3_DRIVERS = ("aws-s3", "s3")
GCS_DRIVERS = ("google-cloud-storage", "gcs")
FS_DRIVERS = ("filesystem",)
# file handles (each an HTTP connection's worth of state for S3) kept open per store
MAX_OPEN_OBJECTS = 64
# writes of a whole object tried again after a store's passing failure (see BlobStore.put)
PUT_ATTEMPTS = 4
TRANSIENT_MARKERS = ("INTERNAL_FAILURE", "SLOW_DOWN", "SERVICE_UNAVAILABLE", "please try again")


class ObjectCounters:
    """Objects written and deleted, and bytes written, by every store of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.puts = 0
        self.put_bytes = 0
        self.deletes = 0

    def put(self, size: int) -> None:
        with self._lock:
            self.puts += 1
            self.put_bytes += size

    def delete(self) -> None:
        with self._lock:
            self.deletes += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"puts": self.puts, "put_bytes": self.put_bytes, "deletes": self.deletes}


OBJECT_COUNTERS = ObjectCounters()


@dataclass(frozen=True)
class OffloadLocation:
    """Where offloaded objects live. ``root`` is a bucket (S3, GCS) or a directory/URI
    (filesystem); ``prefix`` is the path inside it that belongs to one data directory."""

    driver: str
    root: str
    region: str = ""
    endpoint: str = ""
    prefix: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "OffloadLocation":
        return cls(**json.loads(text))

    def url(self, key: str) -> str:
        """A URI ``pyarrow.fs.FileSystem.from_uri`` opens from any process or machine, for the
        object ``key`` (no credentials in it: readers find theirs the standard ways). Spark tasks
        read offloaded ledgers through it (``compaction.compacted_ledger.read_file_bytes``)."""
        rel = "/".join(p.strip("/") for p in (self.prefix, key) if p.strip("/"))
        if self.driver in S3_DRIVERS:
            query = {"region": self.region or "us-east-1"}
            if self.endpoint:
                u = urlparse(self.endpoint if "://" in self.endpoint else "https://" + self.endpoint)
                query.update(endpoint_override=u.netloc, scheme=u.scheme or "https")
            return f"s3://{self.root}/{rel}?" + urlencode(query)
        if self.driver in GCS_DRIVERS:
            if not self.endpoint:
                return f"gs://{self.root}/{rel}"
            u = urlparse(self.endpoint if "://" in self.endpoint else "http://" + self.endpoint)
            query = {"endpoint_override": u.netloc, "scheme": u.scheme or "http"}
            return f"gs://anonymous@{self.root}/{rel}?" + urlencode(query)  # an emulator
        root = self.root if "://" in self.root else "file://" + os.path.abspath(self.root)
        return root + ("" if root.endswith("/") else "/") + rel

    def describe(self) -> str:
        where = f"{self.root}/{self.prefix}".rstrip("/")
        return f"{self.driver}:{where}" + (f" at {self.endpoint}" if self.endpoint else "")


def location_from_url(url: str) -> tuple[OffloadLocation, str]:
    """``(location, key)`` of the object ``url`` names (the inverse of ``OffloadLocation.url``).
    The location is the bucket (or the filesystem's root) with no prefix and the key the object's
    whole path, so every object of a bucket read by URI shares one store (one client, a bounded
    set of open handles). ``StorageError`` for a URI that is no store's."""
    u = urlparse(url)
    scheme = u.scheme.lower()
    key = u.path.strip("/")
    if not key or key.endswith("/") or u.path.endswith("/"):
        raise StorageError(f"{url!r} names no object")
    q = {k: v[-1] for k, v in parse_qs(u.query).items()}
    if scheme == "s3":
        endpoint = ""
        if q.get("endpoint_override"):
            endpoint = f"{q.get('scheme') or 'https'}://{q['endpoint_override']}"
        return OffloadLocation("s3", u.netloc, q.get("region", ""), endpoint), key
    if scheme in ("gs", "gcs"):
        endpoint = ""
        if q.get("endpoint_override"):
            endpoint = f"{q.get('scheme') or 'http'}://{q['endpoint_override']}"
        return OffloadLocation("google-cloud-storage", u.netloc.rpartition("@")[2], endpoint=endpoint), key
    if scheme in ("", "file") and not u.netloc:
        return OffloadLocation("filesystem", "/"), key
    if scheme:  # hdfs://, viewfs://, ...: the filesystem named by scheme and authority
        return OffloadLocation("filesystem", f"{u.scheme}://{u.netloc}"), key
    raise StorageError(f"{url!r} is not an object store URI")


def location_from_settings(settings: Mapping[str, object], prefix: str = "") -> OffloadLocation | None:
    """The location named by broker.conf keys (or an ``offloadPolicies`` object using the same
    names); None when ``managedLedgerOffloadDriver`` is empty. ``InvalidConfiguration`` when the
    driver is unknown or its bucket/URI is missing."""
    driver = str(settings.get("managedLedgerOffloadDriver") or "").strip()
    if not driver:
        return None
    d = driver.lower()
    if d in S3_DRIVERS:
        bucket = str(settings.get("s3ManagedLedgerOffloadBucket") or "")
        if not bucket:
            raise InvalidConfiguration(f"offload driver {driver} needs s3ManagedLedgerOffloadBucket")
        return OffloadLocation(
            d,
            bucket,
            str(settings.get("s3ManagedLedgerOffloadRegion") or ""),
            str(settings.get("s3ManagedLedgerOffloadServiceEndpoint") or ""),
            prefix,
        )
    if d in GCS_DRIVERS:
        bucket = str(settings.get("gcsManagedLedgerOffloadBucket") or "")
        if not bucket:
            raise InvalidConfiguration(f"offload driver {driver} needs gcsManagedLedgerOffloadBucket")
        # an emulator, named the way Google's client libraries look for one
        emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
        return OffloadLocation("google-cloud-storage", bucket, endpoint=emulator, prefix=prefix)
    if d in FS_DRIVERS:
        uri = str(settings.get("fileSystemURI") or "")
        if not uri:
            raise InvalidConfiguration("offload driver filesystem needs fileSystemURI")
        return OffloadLocation("filesystem", uri, prefix=prefix)
    raise InvalidConfiguration(
        f"unknown managedLedgerOffloadDriver {driver!r}: expected aws-s3, S3, google-cloud-storage or filesystem"
    )


def _driver_family(driver: str) -> str:
    d = driver.lower()
    return "s3" if d in S3_DRIVERS else "gcs" if d in GCS_DRIVERS else d


def _place(loc: OffloadLocation) -> tuple[str, str, str]:
    """What makes two locations the same place: driver family, bucket or URI, endpoint."""
    return (_driver_family(loc.driver), loc.root.rstrip("/"), loc.endpoint.rstrip("/"))


def allowed_locations(config: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """The places a namespace's ``offloadPolicies`` may name: the broker's own configured location
    and each ``managedLedgerOffloadAllowedLocations`` entry (``driver=bucket-or-URI[@endpoint]``)."""
    out = []
    own = location_from_settings(config)
    if own is not None:
        out.append(_place(own))
    for item in str(config.get("managedLedgerOffloadAllowedLocations") or "").split(","):
        item = item.strip()
        if not item:
            continue
        driver, sep, rest = item.partition("=")
        root, _, endpoint = rest.partition("@")
        if not sep or not driver.strip() or not root.strip():
            raise InvalidConfiguration(
                f"managedLedgerOffloadAllowedLocations entry {item!r}: expected driver=bucket-or-URI[@endpoint]"
            )
        out.append((_driver_family(driver.strip()), root.strip().rstrip("/"), endpoint.strip().rstrip("/")))
    return out


def check_location_allowed(loc: OffloadLocation, config: Mapping[str, object]) -> None:
    """``InvalidConfiguration`` unless ``loc`` (from a namespace policy) is a place the operator
    allowed: a tenant admin may not send the broker's writes, and the requests it signs with its
    own credentials, anywhere else (docs/security.md)."""
    allowed = allowed_locations(config)
    if _place(loc) in allowed:
        return
    shown = ", ".join(f"{d}={r}" + (f"@{e}" if e else "") for d, r, e in allowed) or "none"
    raise InvalidConfiguration(
        f"offload location {loc.describe()[:200]} is not allowed on this broker (allowed: {shown}; "
        "an operator adds more with managedLedgerOffloadAllowedLocations)"
    )


def _filesystem(loc: OffloadLocation):
    """``(pyarrow FileSystem, base path inside it)`` for a location."""
    from pyarrow import fs

    family = _driver_family(loc.driver)
    if family == "s3":
        kw: dict = {"region": loc.region or "us-east-1"}
        if loc.endpoint:
            u = urlparse(loc.endpoint if "://" in loc.endpoint else "https://" + loc.endpoint)
            kw.update(scheme=u.scheme or "https", endpoint_override=u.netloc)
        # no credentials here: the AWS SDK's default chain finds them (env, profile files, roles)
        return fs.S3FileSystem(**kw), loc.root
    if family == "gcs":
        if loc.endpoint:  # an emulator (STORAGE_EMULATOR_HOST): no credentials
            u = urlparse(loc.endpoint if "://" in loc.endpoint else "http://" + loc.endpoint)
            return (
                fs.GcsFileSystem(anonymous=True, endpoint_override=u.netloc, scheme=u.scheme or "http"),
                loc.root,
            )
        return fs.GcsFileSystem(), loc.root  # application-default credentials
    if family not in FS_DRIVERS:
        # never guess: an unknown driver read as a directory would put objects on local disk
        raise InvalidConfiguration(
            f"unknown offload driver {loc.driver!r}: expected aws-s3, S3, google-cloud-storage or filesystem"
        )
    root = loc.root
    if "://" not in root:
        return fs.LocalFileSystem(), os.path.abspath(root)
    filesystem, path = fs.FileSystem.from_uri(root)
    return filesystem, path


class BlobStore:
    """Immutable objects under one location. Thread-safe. Keys are ``/``-separated paths
    relative to the location's prefix."""

    def __init__(self, location: OffloadLocation):
        self.location = location
        try:
            self.fs, base = _filesystem(location)
        except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a bad URI or missing library
            raise StorageError(f"cannot open offload store {location.describe()}: {e}") from e
        self.base = "/".join(p for p in (base.rstrip("/"), location.prefix.strip("/")) if p)
        from pyarrow import fs

        self.local = isinstance(self.fs, fs.LocalFileSystem)
        self._lock = threading.Lock()
        self._files: OrderedDict[str, object] = OrderedDict()

    def path(self, key: str) -> str:
        return f"{self.base}/{key}"

    def uri(self, key: str) -> str:
        """A readable name for logs and stats (no credentials)."""
        return f"{self.location.driver}://{self.path(key)}"

    # --- writing -----------------------------------------------------------------------------

    def put(self, key: str, chunks: Iterable[bytes | memoryview]) -> int:
        """Write a new object from ``chunks``; durable when this returns. Returns its size.

        A store's passing failure (S3 ``INTERNAL_FAILURE``, ``SLOW_DOWN``, ``SERVICE_UNAVAILABLE``:
        "please try again") is tried again, at most ``PUT_ATTEMPTS`` times with a short backoff,
        when ``chunks`` is a list or tuple (a stream cannot be read twice). A retry is safe:
        the key is new and a failed multipart upload publishes nothing."""
        attempts = PUT_ATTEMPTS if isinstance(chunks, (list, tuple)) else 1
        for attempt in range(1, attempts + 1):
            try:
                size = self._put_once(key, chunks)
                OBJECT_COUNTERS.put(size)
                return size
            except StorageError as e:
                if attempt >= attempts or not any(m in str(e) for m in TRANSIENT_MARKERS):
                    raise
                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _put_once(self, key: str, chunks: Iterable[bytes | memoryview]) -> int:
        path = self.path(key)
        size = 0
        try:
            if self.local:
                # plain file I/O so the bytes can be fsynced before the caller commits the name
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    for c in chunks:
                        f.write(c)
                        size += len(c)
                    f.flush()
                    os.fsync(f.fileno())
                fd = os.open(os.path.dirname(path), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                return size
            if self.location.driver in FS_DRIVERS:  # HDFS wants its directories; object stores do not
                self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(path) as out:  # S3: a multipart upload, published at close
                for c in chunks:
                    out.write(c)
                    size += len(c)
            return size
        except StorageError:
            raise
        except Exception as e:
            raise StorageError(f"offload: writing {self.uri(key)} failed: {e}") from e

    def put_file(self, key: str, path: str, chunk: int = 8 << 20) -> int:
        """Upload the local file ``path`` as object ``key`` (streamed); returns its size."""
        with open(path, "rb") as f:
            return self.put(key, iter(lambda: f.read(chunk), b""))

    # --- reading -----------------------------------------------------------------------------

    def size(self, key: str) -> int:
        try:
            return int(self.fs.get_file_info(self.path(key)).size)
        except Exception as e:
            raise StorageError(f"offload: cannot stat {self.uri(key)}: {e}") from e

    def _open(self, key: str, size: int | None):
        with self._lock:
            f = self._files.get(key)
            if f is not None:
                self._files.move_to_end(key)
                return f
        # opening costs one HEAD request (S3); the handle is kept, so each read after it is ONE
        # ranged GET
        f = self.fs.open_input_file(self.path(key))
        with self._lock:
            self._files[key] = f
            while len(self._files) > MAX_OPEN_OBJECTS:
                _, old = self._files.popitem(last=False)
                try:
                    old.close()
                except Exception:
                    pass
        return f

    def read_range(self, key: str, offset: int, length: int, size: int | None = None) -> bytes:
        """``length`` bytes at ``offset`` (one ranged read). ``StorageError`` when short."""
        try:
            data = self._open(key, size).read_at(length, offset)
        except Exception as e:
            self.forget(key)
            raise StorageError(f"offload: reading {self.uri(key)} [{offset}, +{length}) failed: {e}") from e
        if len(data) != length:
            raise StorageError(f"offload: {self.uri(key)} is shorter than expected ({offset}+{length})")
        return data

    def read_all(self, key: str):
        """The whole object as a ``pyarrow.Buffer``."""
        try:
            with self.fs.open_input_file(self.path(key)) as f:
                return f.read_buffer()
        except Exception as e:
            raise StorageError(f"offload: reading {self.uri(key)} failed: {e}") from e

    def exists(self, key: str) -> bool:
        from pyarrow import fs

        return self.fs.get_file_info(self.path(key)).type == fs.FileType.File

    def list(self, prefix: str) -> list[str]:
        """Keys of the objects under ``prefix`` (recursive)."""
        from pyarrow import fs

        base = self.path(prefix).rstrip("/")
        try:
            infos = self.fs.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
        except Exception as e:
            raise StorageError(f"offload: listing {self.uri(prefix)} failed: {e}") from e
        cut = len(self.base) + 1
        return sorted(i.path[cut:] for i in infos if i.type == fs.FileType.File)

    # --- deleting ----------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        """Delete an object; a missing one is not an error (deletion is retried after crashes).
        On S3, pyarrow leaves an empty directory marker (a zero-byte ``prefix/`` key) when the
        last object under a prefix goes; ``list`` never reports markers."""
        self.forget(key)
        from pyarrow import fs

        try:
            if self.fs.get_file_info(self.path(key)).type == fs.FileType.NotFound:
                return
            self.fs.delete_file(self.path(key))
            OBJECT_COUNTERS.delete()
        except FileNotFoundError:
            return
        except Exception as e:
            raise StorageError(f"offload: deleting {self.uri(key)} failed: {e}") from e

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix`` (a compacted ledger stored as parts)."""
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def forget(self, key: str) -> None:
        with self._lock:
            f = self._files.pop(key, None)
        if f is not None:
            try:
                f.close()
            except Exception:
                pass


_stores: dict[OffloadLocation, BlobStore] = {}
_stores_lock = threading.Lock()


def open_store(location: OffloadLocation) -> BlobStore:
    """The process's store for ``location`` (one per location: handles and connections are shared)."""
    with _stores_lock:
        store = _stores.get(location)
        if store is None:
            store = _stores[location] = BlobStore(location)
        return store
