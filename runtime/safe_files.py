"""Files read back from a folder others might write: the one rule nnatlas applies, as ssh does with its keys.

A folder (or file) nnatlas keeps its own state in (the draft cache) is read only when this user owns it and neither
group nor others can write it; the file itself is opened without following a link (a link out of the folder is
refused), must be a regular file, and is read only up to a size bound checked before reading. Folders nnatlas makes
for its state are 0700, files 0600, each written whole under a temporary name and renamed. Folders a user names
(``NNATLAS_SPECS``, ``spec=FILE``, a dataset cache) are the user's choice: one that others can write is said in one
warning line, with the fix, and still read.

A leaf: imports nothing of nnatlas (the runtime's draft cache and the dataset cache both use it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
import warnings
from pathlib import Path

__all__ = ["FileLock", "Unsafe", "UnsafeFolderWarning", "folder_refusal", "make_private_dir", "others_can_write",
           "read_private", "warn_if_others_write", "write_private"]


class Unsafe(Exception):
    """Why a file is not read, in one line (the file's path is the caller's to add)."""


class UnsafeFolderWarning(UserWarning):
    """A folder or file that others can write, named with the fix."""


def _owner_and_mode(st: os.stat_result) -> str | None:
    """Why a file or folder of this stat is not trusted: not this user's, or writable by group or others."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def folder_refusal(folder: Path) -> str | None:
    """Why ``folder`` (one nnatlas keeps its state in) is not read: one line naming it and the fix; None when it is
    this user's and only this user can write it, or when it does not exist (it is made 0700)."""
    try:
        st = folder.stat()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{folder}: cannot be read ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder}: not a folder"
    why = _owner_and_mode(st)
    if why is None:
        return None
    fix = f"`chmod go-w {folder}`" if st.st_uid == os.geteuid() else f"`chown $USER {folder}` and `chmod go-w {folder}`"
    return f"{folder} is {why}: nothing in it is read ({fix} to use it)"


def read_private(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of this user's that only this user can write, of at most ``limit`` bytes,
    opened without following a link. Raises FileNotFoundError when there is none, Unsafe (saying why) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Unsafe(f"a link (to {os.path.realpath(path)}), not a file of the folder") from None
        raise Unsafe(f"cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)  # (of what was opened: a file swapped after a check of its name is not what is read)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe("not a regular file")
        why = _owner_and_mode(st)
        if why is not None:
            raise Unsafe(why)
        if st.st_size > limit:
            raise Unsafe(f"{st.st_size:,} bytes, more than the {limit:,} one can hold")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # (grew while read)
            raise Unsafe(f"more than the {limit:,} bytes one can hold")
        return data
    finally:
        os.close(fd)


def make_private_dir(folder: Path) -> None:
    """``folder`` and any missing parents, each made 0700 (the folders that already exist are left as they are)."""
    missing = []
    p = folder
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(p, 0o700)  # (mkdir's mode is masked by the umask; 0700 is what is meant)


def write_private(path: Path, data: bytes) -> None:
    """``data`` as ``path``, 0600, whole or not at all: written and synced under a temporary name in the same folder,
    then renamed over ``path`` (a reader sees the old file or the new one, never a part). Raises OSError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def others_can_write(path: Path) -> str | None:
    """Why others may change what ``path`` (a file or folder a user named) holds: it, or the folder it is in, is
    writable by others (a folder with the sticky bit, as /tmp, lets no one replace another's file). None if not."""
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_mode & stat.S_IWOTH and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): `chmod go-w {path}`"
    if not stat.S_ISDIR(st.st_mode):
        parent = path.resolve().parent
        try:
            pst = parent.stat()
        except OSError:
            return None
        if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
            return (f"{path} is in a folder others can write (mode {stat.S_IMODE(pst.st_mode):04o}), where anyone can "
                    f"replace it: `chmod go-w {parent}`")
    return None


def warn_if_others_write(path: Path, what: str, stacklevel: int = 3) -> None:
    """One warning line when others can write ``path`` (see :func:`others_can_write`); ``what`` says why it matters."""
    why = others_can_write(path)
    if why is not None:
        warnings.warn(f"{why} ({what})", UnsafeFolderWarning, stacklevel=stacklevel)


class FileLock:
    """An exclusive ``flock`` on ``path`` (made 0600, left in place: removing a lock file races its next taker),
    waited for at most ``timeout`` seconds. ``acquired`` says whether it was taken; a process that dies holding it
    releases it (the kernel does)."""

    def __init__(self, path: Path, timeout: float, poll: float = 0.05):
        self.path, self.timeout, self.poll = path, timeout, poll
        self.fd: int | None = None
        self.acquired = False
        self.waited = 0.0

    def __enter__(self) -> FileLock:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError:
            return self  # (a folder that cannot be written: not taken)
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    break
                if time.monotonic() - start >= self.timeout:
                    break
                time.sleep(self.poll)
                continue
            self.acquired = True
            break
        self.waited = time.monotonic() - start
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # (releases the lock)
            self.fd = None
        self.acquired = False
