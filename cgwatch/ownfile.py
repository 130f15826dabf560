"""Internal. A small file of this uid's own that its processes share: opened read-write in the
first directory of a list where one can be had that no other user can touch. quota.py keeps
the uid's inotify count in one, slurmctl.py a job's answer from the controller."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence


def open_own(name: str, uid: int, environ: Mapping[str, str],
             dirs: Sequence[str]) -> tuple[int, str]:
    """`name` in the first of `dirs` (`$VAR`: that variable's absolute path, skipped when
    unset or relative) where it opens read-write (made 0600 if missing) as a regular file
    owned by `uid` and open to no one else: (its descriptor, its directory), or (-1, "").
    Another user could make the name first, to mislead us or to stop us: such a file, a
    symlink (O_NOFOLLOW) or one open to others is passed over."""
    for directory in dirs:
        if directory.startswith("$"):
            directory = environ.get(directory[1:], "")
            if not directory.startswith("/"):
                continue
        try:
            fd = os.open(os.path.join(directory, name),
                         os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid == uid and stat.S_ISREG(st.st_mode) and not st.st_mode & 0o077:
                return fd, directory
        except OSError:
            pass
        os.close(fd)
    return -1, ""
