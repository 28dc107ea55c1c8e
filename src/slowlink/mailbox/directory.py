"""A mailbox in a directory, shared by processes on one machine or on a shared file system.

Create-once is an exclusive hard link of a finished temporary file (atomic, one winner); compare-and-swap
holds an flock on a per-key lock file only for the swap. Every write lands whole through a rename, so a
reader never sees a partial object. The directory is not trusted to be a plain folder: below its root no
link is followed, nothing but a regular file is opened, and no name is used that fails `check_key`
(beneath.py walks it).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from ..errors import MailboxRejected, MailboxUnavailable, ObjectTooLarge, PreconditionFailed
from .beneath import Unsafe, lstat_regular, open_file, open_folder, open_lock
from .contract import Listing, Object, check_key, is_key
from .ignored import IgnoredHook, IgnoredKeys, warn_ignored
from .limits import read_capped, resolve_limit

_INTERNAL = ".slowlink"  # temporary files and locks live here, outside every key
_SCRATCH, _LOCKS = (_INTERNAL, "tmp"), (_INTERNAL, "locks")
# A node holds a key's lock for one rename; one held this long is held by a process outside the run.
LOCK_SECONDS = 10.0
_MAX_DEPTH = 16  # folders a listing descends; slowlink's keys are at most 4 parts deep
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_NOT_ALLOWED = {errno.EACCES, errno.EPERM, errno.EROFS}
_ODD_NAME = "a name slowlink never writes (keys are '/'-separated letters, digits, '.', '_' and '-')"


def _etag(found: os.stat_result) -> str:
    # Every write is a new file renamed into place, so (inode, mtime, size) changes on every write.
    return f"{found.st_ino:x}-{found.st_mtime_ns:x}-{found.st_size:x}"


class DirMailbox:
    """The storage contract over the folder `path`.

    `on_ignored(key, reason)` is called once per path below the root that is a link, a special file or an
    odd name, the first time a verb meets it; by default it logs a warning on the "slowlink" logger.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.on_ignored: IgnoredHook = warn_ignored
        self._ignored = IgnoredKeys()

    # -- writing -----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        parts = check_key(key).split("/")
        with ExitStack() as stack:
            root = self._open_root(create=True)
            stack.callback(os.close, root)
            # The key's folder first: a put refused for its path leaves no temporary file behind.
            folder = self._writable_folder(root, parts[:-1], key)
            stack.callback(os.close, folder)
            scratch = self._writable_folder(root, _SCRATCH, key)
            stack.callback(os.close, scratch)
            temporary, etag = self._write_temporary(scratch, key, data)
            stack.callback(_remove, scratch, temporary)  # a no-op once it was renamed into place
            try:
                self._commit(root, scratch, temporary, folder, parts[-1], key, if_absent, if_match)
            except OSError as error:
                raise self._cannot_write(key, error) from error
            return etag

    def _write_temporary(self, scratch: int, key: str, data: bytes) -> tuple[str, str]:
        temporary = f"{os.getpid()}-{time.monotonic_ns()}-{os.urandom(4).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(temporary, flags, 0o666, dir_fd=scratch)
        except OSError as error:
            raise self._cannot_write(key, error) from error
        try:
            try:
                view = memoryview(data).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
                # Inodes are reused at once, and kernels before 6.13 stamp files with a clock that ticks
                # only every few milliseconds, so two quick writes of one size could repeat an etag (ABA
                # under compare-and-swap). A nanosecond stamp from the fine clock makes each etag new.
                now = time.time_ns()
                os.utime(fd, ns=(now, now))
                etag = _etag(os.fstat(fd))
            finally:
                os.close(fd)
        except OSError as error:
            _remove(scratch, temporary)
            raise self._cannot_write(key, error) from error
        return temporary, etag

    def _commit(
        self, root: int, scratch: int, temporary: str, folder: int, name: str, key: str,
        if_absent: bool, if_match: str | None,
    ) -> None:  # fmt: skip
        move = {"src_dir_fd": scratch, "dst_dir_fd": folder}
        if if_absent:
            try:
                os.link(temporary, name, **move)
                return
            except FileExistsError:
                if lstat_regular(folder, name) is not None:
                    raise PreconditionFailed(f"{key} already exists") from None
            # A link or a special file holds the name: no object, so this write may replace it. Under
            # the key's lock, so that of two creators finding it there, exactly one does.
            with self._key_lock(root, key):
                if lstat_regular(folder, name) is not None:
                    raise PreconditionFailed(f"{key} already exists")
                os.replace(temporary, name, **move)
        elif if_match is not None:
            with self._key_lock(root, key):
                current = lstat_regular(folder, name)
                if current is None or _etag(current) != if_match:
                    raise PreconditionFailed(f"{key} changed since etag {if_match}")
                os.replace(temporary, name, **move)
        else:
            os.replace(temporary, name, **move)  # replaces a link itself, never what it points to

    @contextmanager
    def _key_lock(self, root: int, key: str) -> Iterator[None]:
        name = hashlib.sha1(key.encode()).hexdigest()
        path = "/".join((*_LOCKS, name))
        locks = self._writable_folder(root, _LOCKS, key)
        try:
            fd = open_lock(locks, name, path)
        except Unsafe as unsafe:
            raise MailboxRejected(
                f"cannot write {key} in mailbox directory {self.path}: its lock file {path} is {unsafe.what}; "
                f"remove {self.path / path}"
            ) from None
        finally:
            os.close(locks)
        try:
            self._wait_for_lock(fd, key, path)
            yield
        finally:
            os.close(fd)  # which releases the lock

    def _wait_for_lock(self, fd: int, key: str, path: str) -> None:
        deadline, pause = time.monotonic() + LOCK_SECONDS, 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise MailboxUnavailable(
                        f"cannot write {key} in mailbox directory {self.path}: its lock file {path} was held "
                        f"for {LOCK_SECONDS} s, and a node holds it only for one rename; find the process "
                        f"holding it (fuser {self.path / path}) and stop it"
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, 0.01)

    def _writable_folder(self, root: int, parts: tuple[str, ...] | list[str], key: str) -> int:
        try:
            return open_folder(root, parts, create=True)
        except Unsafe as unsafe:
            raise MailboxRejected(
                f"cannot write {key} in mailbox directory {self.path}: {unsafe.path} is {unsafe.what}, and a "
                f"mailbox never writes through one; remove {self.path / unsafe.path} or replace it with a "
                "real folder (to keep a run on another disk, point DirMailbox at a folder there)"
            ) from None
        except OSError as error:
            raise self._cannot_write(key, error) from error

    def _cannot_write(self, key: str | None, error: OSError) -> MailboxRejected:
        where = f"{key} in mailbox directory {self.path}" if key else f"to mailbox directory {self.path}"
        if error.errno in _DISK_FULL:
            fix = "free space on it, or move the run to a disk with room"
            return MailboxRejected(f"cannot write {where}: the disk is full ({error.strerror}); {fix}")
        if error.errno == errno.EFBIG:
            return MailboxRejected(
                f"cannot write {where}: it is larger than this file system or this process's file size "
                f"limit allows ({error.strerror}); raise the limit (ulimit -f) or move the run"
            )
        if key is None or error.errno in _NOT_ALLOWED:
            return MailboxRejected(
                f"cannot write {where}: {error.strerror}; choose a path this process can create and "
                "write, e.g. DirMailbox('/tmp/my-run')"
            )
        return MailboxRejected(f"cannot write {where}: {error.strerror or error}")

    # -- reading -----------------------------------------------------------------------------------

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        parts = check_key(key).split("/")
        limit = resolve_limit(max_bytes)
        with ExitStack() as stack:
            root = self._open_root(create=False)
            if root is None:
                return None
            stack.callback(os.close, root)
            try:
                folder = open_folder(root, parts[:-1])
                stack.callback(os.close, folder)
                fd, found = open_file(folder, parts[-1], key)
                stack.callback(os.close, fd)
            except (FileNotFoundError, NotADirectoryError):
                return None
            except Unsafe as unsafe:
                self._ignore(unsafe)
                return None
            except OSError as error:
                raise self._cannot_read(key, error) from error
            etag = _etag(found)
            if etag == if_none_match:
                return Object(None, etag)
            if found.st_size > limit:
                raise ObjectTooLarge(key, found.st_size, limit, str(self.path))
            try:
                data = read_capped(
                    lambda n: os.read(fd, n),
                    expected=found.st_size,
                    limit=limit,
                    key=key,
                    where=str(self.path),
                )
            except OSError as error:
                raise self._cannot_read(key, error) from error
            return Object(data, etag)

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        # Walk only the deepest folder the prefix names, then filter by the full prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if base and not is_key(base):  # no key starts with it ('..' included): nothing to walk
            return []
        found: list[Listing] = []
        with ExitStack() as stack:
            root = self._open_root(create=False)
            if root is None:
                return []
            stack.callback(os.close, root)
            try:
                folder = open_folder(root, base.split("/") if base else [])
            except (FileNotFoundError, NotADirectoryError):
                return []
            except Unsafe as unsafe:
                self._ignore(unsafe)
                return []
            stack.callback(os.close, folder)
            self._walk(folder, base, prefix, found, 0)
        after = None if start_after is None else start_after.encode()
        return sorted(
            (item for item in found if after is None or item.key.encode() > after),
            key=lambda item: item.key.encode(),
        )

    def _walk(self, folder: int, base: str, prefix: str, found: list[Listing], depth: int) -> None:
        with os.scandir(folder) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            path = f"{base}/{name}" if base else name
            if (not base and name == _INTERNAL) or not (
                path.startswith(prefix) or prefix.startswith(path + "/")
            ):
                continue
            try:
                found_stat = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:  # deleted while we walked
                continue
            mode = found_stat.st_mode
            if not is_key(name):
                self._report(path, _ODD_NAME)
            elif stat.S_ISREG(mode):
                if path.startswith(prefix):
                    found.append(Listing(path, _etag(found_stat), found_stat.st_size))
            elif not stat.S_ISDIR(mode):
                self._ignore(Unsafe(path, mode))
            elif depth >= _MAX_DEPTH:
                self._report(path, f"a folder nested deeper than {_MAX_DEPTH} folders, not walked")
            else:
                try:
                    child = open_folder(folder, [name])
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except Unsafe as unsafe:  # became a link since we looked
                    self._ignore(Unsafe(path, unsafe.mode))
                    continue
                try:
                    self._walk(child, path, prefix, found, depth + 1)
                finally:
                    os.close(child)

    def _cannot_read(self, key: str, error: OSError) -> MailboxRejected:
        return MailboxRejected(
            f"cannot read {key} in mailbox directory {self.path}: {error.strerror or error}; "
            "check that this process may read the folder and its files"
        )

    # -- deleting, and the rest --------------------------------------------------------------------

    def delete(self, keys: list[str]) -> None:
        split = [check_key(key).split("/") for key in keys]  # all checked first, so a bad key deletes nothing
        root = self._open_root(create=False)
        if root is None:
            return
        try:
            for key, parts in zip(keys, split, strict=True):
                self._delete_one(root, key, parts)
        finally:
            os.close(root)

    def _delete_one(self, root: int, key: str, parts: list[str]) -> None:
        try:
            folder = open_folder(root, parts[:-1])
        except (FileNotFoundError, NotADirectoryError):
            return
        except Unsafe as unsafe:  # under a link: never deleted through it
            self._ignore(unsafe)
            return
        except OSError as error:
            raise MailboxRejected(f"cannot delete {key} in mailbox directory {self.path}: {error}") from error
        try:
            os.unlink(parts[-1], dir_fd=folder)  # a link itself goes, never what it points to
        except (FileNotFoundError, IsADirectoryError):
            pass  # absent, or a folder: not an object either way
        except OSError as error:
            if not (
                error.errno == errno.EPERM and lstat_regular(folder, parts[-1]) is None
            ):  # macOS: a folder
                raise MailboxRejected(
                    f"cannot delete {key} in mailbox directory {self.path}: {error}"
                ) from error
        finally:
            os.close(folder)

    def _open_root(self, *, create: bool) -> int | None:
        """The root folder (links allowed: the user chose it); None when absent and not to be created."""
        try:
            if create:
                self.path.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            if not create and error.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if create:
                raise self._cannot_write(None, error) from error
            raise MailboxRejected(
                f"cannot read mailbox directory {self.path}: {error.strerror}; check that it is a folder "
                "this process may read"
            ) from error

    def _ignore(self, unsafe: Unsafe) -> None:
        if not unsafe.is_folder:  # a folder where a key was asked for is only absent
            self._report(unsafe.path, f"{unsafe.what}; a mailbox opens only regular files and real folders")

    def _report(self, path: str, reason: str) -> None:
        self._ignored.report(self.on_ignored, path, reason)

    def clock(self) -> float:
        return time.time()

    def __reduce__(self) -> tuple:
        # A copy for another process gets the path, and the default hook and its own memory of reports.
        return DirMailbox, (self.path,)

    def __repr__(self) -> str:
        return f"DirMailbox({str(self.path)!r})"


def _remove(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass
