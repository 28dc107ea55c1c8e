"""A mailbox in a directory, shared by processes on one machine or on a shared file system.

Create-once is an exclusive hard link of a finished temporary file (atomic, one winner); compare-and-swap
holds an flock on a per-key lock file only for the swap. Every write lands whole through a rename, so a
reader never sees a partial object.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
from pathlib import Path

from ..errors import MailboxRejected, PreconditionFailed
from .contract import Listing, Object, check_key

_INTERNAL = ".slowlink"  # temporary files and locks live here, outside every key


def _etag(stat: os.stat_result) -> str:
    # Every write is a new file renamed into place, so (inode, mtime, size) changes on every write.
    return f"{stat.st_ino:x}-{stat.st_mtime_ns:x}-{stat.st_size:x}"


class DirMailbox:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def _file(self, key: str) -> Path:
        return self.path / check_key(key)

    def _write_temporary(self, data: bytes) -> Path:
        scratch = self.path / _INTERNAL / "tmp"
        try:
            scratch.mkdir(parents=True, exist_ok=True)
            temporary = scratch / f"{os.getpid()}-{time.monotonic_ns()}-{os.urandom(4).hex()}"
            with open(temporary, "wb") as out:
                out.write(data)
            # Inodes are reused at once, and kernels before 6.13 stamp files with a clock that ticks only
            # every few milliseconds, so two quick writes of one size could repeat an etag (ABA under
            # compare-and-swap). A nanosecond stamp from the fine clock makes each write's etag new.
            now = time.time_ns()
            os.utime(temporary, ns=(now, now))
        except OSError as error:
            raise MailboxRejected(
                f"cannot write to mailbox directory {self.path}: {error.strerror}; "
                "choose a path this process can create and write, e.g. DirMailbox('/tmp/my-run')"
            ) from error
        return temporary

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        target = self._file(key)
        temporary = self._write_temporary(data)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            etag = _etag(temporary.stat())
            if if_absent:
                try:
                    os.link(temporary, target)
                except FileExistsError:
                    raise PreconditionFailed(f"{key} already exists") from None
            elif if_match is not None:
                with self._key_lock(key):
                    try:
                        current = _etag(target.stat())
                    except FileNotFoundError:
                        current = None
                    if current != if_match:
                        raise PreconditionFailed(f"{key} changed since etag {if_match}")
                    os.replace(temporary, target)
            else:
                os.replace(temporary, target)
            return etag
        except OSError as error:
            raise MailboxRejected(f"cannot write {key} in mailbox directory {self.path}: {error}") from error
        finally:
            temporary.unlink(missing_ok=True)

    def _key_lock(self, key: str):
        locks = self.path / _INTERNAL / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        return _FileLock(locks / hashlib.sha1(key.encode()).hexdigest())

    def get(self, key: str, *, if_none_match: str | None = None) -> Object | None:
        try:
            with open(self._file(key), "rb") as source:
                etag = _etag(os.fstat(source.fileno()))
                if etag == if_none_match:
                    return Object(None, etag)
                return Object(source.read(), etag)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:
            return None

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        # Walk only the deepest directory the prefix names, then filter by the full prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        root = self.path / base if base else self.path
        found = []
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = [d for d in subdirectories if d != _INTERNAL]
            for name in files:
                full = Path(directory) / name
                key = full.relative_to(self.path).as_posix()
                if not key.startswith(prefix) or (
                    start_after is not None and key.encode() <= start_after.encode()
                ):
                    continue
                try:
                    stat = full.stat()
                except FileNotFoundError:  # deleted while we walked
                    continue
                found.append(Listing(key, _etag(stat), stat.st_size))
        return sorted(found, key=lambda item: item.key.encode())

    def delete(self, keys: list[str]) -> None:
        files = [self._file(key) for key in keys]  # all checked first, so a bad key deletes nothing
        for key, file in zip(keys, files, strict=True):
            try:
                file.unlink()
            except FileNotFoundError:
                pass
            except OSError as error:
                if error.errno != errno.ENOENT:
                    raise MailboxRejected(
                        f"cannot delete {key} in mailbox directory {self.path}: {error}"
                    ) from error

    def clock(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return f"DirMailbox({str(self.path)!r})"


class _FileLock:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> _FileLock:
        self._handle = open(self.path, "a+b")
        fcntl.flock(self._handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
