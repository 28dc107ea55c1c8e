"""Opening folders and files beneath a mailbox's root, one name at a time, never following a link.

Each folder on the way is opened with O_NOFOLLOW | O_DIRECTORY relative to the folder before it (the
`dir_fd` of each call), so a link or a special file anywhere below the root is met and refused, and a
rename while we walk cannot send us elsewhere: a descriptor keeps naming the folder it opened. The root
itself is the user's choice and may be reached through links. What to do about a refusal is the
mailbox's business (directory.py).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

# O_NONBLOCK: opening a FIFO would otherwise wait for a writer, forever.
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# What open(O_NOFOLLOW | O_DIRECTORY) says of a link or a non-folder: ELOOP (Linux, macOS), EMLINK
# (FreeBSD), ENOTDIR; each is then looked at with lstat to say which it was.
_REFUSALS = {errno.ELOOP, errno.EMLINK, errno.ENOTDIR}


class Unsafe(Exception):
    """`path` (relative to the root) is a link, a special file or a folder where a plain one was needed."""

    def __init__(self, path: str, mode: int) -> None:
        super().__init__(f"{path} is {describe(mode)}")
        self.path, self.mode = path, mode

    @property
    def is_folder(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def what(self) -> str:
        return describe(self.mode)


def describe(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def open_folder(root: int, parts: Sequence[str], *, create: bool = False) -> int:
    """A new descriptor of the folder root/parts[0]/parts[1]/..., which the caller closes.

    create: make missing folders on the way. Raises FileNotFoundError if one is missing,
    NotADirectoryError if a regular file is in the way, Unsafe if a link or a special file is.
    """
    folder = os.dup(root)
    try:
        for depth, name in enumerate(parts):
            if create:
                try:
                    os.mkdir(name, dir_fd=folder)
                except FileExistsError:
                    pass
            try:
                child = os.open(name, _FOLDER, dir_fd=folder)
            except OSError as error:
                if error.errno in _REFUSALS:
                    _refuse(folder, name, "/".join(parts[: depth + 1]), error)
                raise
            os.close(folder)
            folder = child
        return folder
    except BaseException:
        os.close(folder)
        raise


def _refuse(folder: int, name: str, path: str, error: OSError) -> None:
    mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode  # FileNotFoundError: gone since
    if stat.S_ISREG(mode):
        raise NotADirectoryError(errno.ENOTDIR, f"{path} is a file, not a folder") from error
    if not stat.S_ISDIR(mode):
        raise Unsafe(path, mode) from None
    # A folder after all: it replaced what was there while we looked. Let the caller try again later.
    raise FileNotFoundError(errno.ENOENT, f"{path} changed while it was opened") from error


def open_file(folder: int, name: str, path: str) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file `name` in `folder` and its stat; `path` names it in errors.

    Raises FileNotFoundError if absent, Unsafe if it is anything but a regular file (a folder included).
    It is looked at before it is opened, so a FIFO or a device is never opened at all; one swapped in
    between the look and the open is opened without blocking, and refused by the second look.
    """
    mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        raise Unsafe(path, mode)
    try:
        fd = os.open(name, _FILE, dir_fd=folder)
    except OSError as error:
        if error.errno in _REFUSALS:  # a link now
            raise Unsafe(path, stat.S_IFLNK) from None
        raise
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise Unsafe(path, opened.st_mode)
        return fd, opened
    except BaseException:
        os.close(fd)
        raise


def open_lock(folder: int, name: str, path: str) -> int:
    """A read-write descriptor of the regular file `name` in `folder`, created if absent, for flock.

    Raises Unsafe if something else (a link, a FIFO, a device) has the name; it is then never opened.
    """
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):
        raise Unsafe(path, mode)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o666, dir_fd=folder)
    except OSError as error:
        if error.errno in _REFUSALS:
            raise Unsafe(path, stat.S_IFLNK) from None
        raise
    opened = os.fstat(fd).st_mode
    if not stat.S_ISREG(opened):
        os.close(fd)
        raise Unsafe(path, opened)
    return fd


def lstat_regular(folder: int, name: str) -> os.stat_result | None:
    """The stat of `name` in `folder` if it is a regular file; None if absent or anything else."""
    try:
        found = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return found if stat.S_ISREG(found.st_mode) else None
