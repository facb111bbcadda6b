"""A secret the configuration names by path (a registry's password file, an object store's
credentials file): an admin's file that only the plane's account may read. It is opened through no
link, must be a regular file of the plane's own account with no permission for group or others,
and is read up to a bound; what it must hold is the caller's to check."""

from __future__ import annotations

import errno
import os
import stat

from trainyard.services.errors import ServiceError


def read_secret_file(path: str, where: str, limit: int, hint: str = "") -> bytes:
    """At most `limit` + 1 bytes of `path` (one more than allowed, so the caller can tell "too long").

    Raises:
        ServiceError: field `where`; a link, not a regular file, readable by others, or not there.
        `hint` ends the message when the file cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # plane's own: a secret
    except OSError as e:
        why = "is a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e)).lower()
        raise ServiceError(f"{where}: {path} {why}{hint}", field=where) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ServiceError(f"{where}: {path} is not a regular file", field=where)
        if st.st_mode & 0o077 or st.st_uid != os.geteuid():
            raise ServiceError(f"{where}: {path} may be read by others than the control plane's account "
                               f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); chown it to the plane "
                               "and chmod 600", field=where)
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)
