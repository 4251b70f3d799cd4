"""The first process of a sandbox, before bubblewrap: it puts itself under the sandbox's
limits, gives up the worker's user, and becomes ``bwrap``.

Run by the worker as ``python -I -S launch.py`` (the standard library only, no site, so
it starts in milliseconds and imports nothing of the app's), with its instructions as
JSON in ``RATCHET_LAUNCH``; everything else of its environment goes on to bubblewrap.

* It joins the sandbox's cgroups (writes its own pid to each ``cgroup.procs``) and sets
  its rlimits, so that nothing it starts runs outside them.
* A worker running as root starts its sandboxes as the host's ``nobody`` (uid and gid
  65534, no supplementary groups): bubblewrap maps the sandbox's user to the user that
  runs it, and a sandbox that is root outside could read every file of Ratchet's that
  it can reach. As ``nobody``, files Ratchet keeps at mode 0600 are closed to it even
  where they are visible.
* ``nobody`` cannot reach what sits below a folder closed to others (an interpreter under
  ``/root/.pyenv``, an app under ``/root``); bubblewrap resolves every source it mounts
  as the sandbox's user. So before giving up root, the launcher makes a mount namespace
  of its own (private: nothing of it reaches the host) with a tmpfs at ``stage``, and
  binds each such source there, at ``stage/<n>``; bubblewrap mounts ``stage/<n>`` at
  the source's own path. The namespace lives as long as the sandbox and goes with it.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from collections.abc import Callable
from typing import cast

SPEC_ENV = "RATCHET_LAUNCH"

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
_RLIMITS = {"as": resource.RLIMIT_AS, "nproc": resource.RLIMIT_NPROC, "cpu": resource.RLIMIT_CPU}


def _fail(what: str, err: int | None = None) -> None:
    detail = f": {os.strerror(err)}" if err else ""
    print(f"ratchet sandbox launcher: {what}{detail}", file=sys.stderr, flush=True)
    os._exit(70)


def _libc(name: str) -> Callable[..., int]:
    return cast(Callable[..., int], getattr(ctypes.CDLL(None, use_errno=True), name))


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    if (
        _libc("mount")(_enc(source), _enc(target), _enc(fstype), ctypes.c_ulong(flags), _enc(data))
        != 0
    ):
        _fail(f"cannot mount {source or fstype} on {target}", ctypes.get_errno())


def stage(sources: list[str], where: str) -> None:
    """Bind each of ``sources`` at ``where/<n>``, in a mount namespace of this process's
    own (see the module docstring)."""
    if _libc("unshare")(_CLONE_NEWNS) != 0:
        _fail("cannot make a mount namespace", ctypes.get_errno())
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", where, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0711,size=1m")
    for n, source in enumerate(sources):
        target = os.path.join(where, str(n))
        if os.path.isdir(source):
            os.mkdir(target, 0o711)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
        _mount(source, target, None, _MS_BIND | _MS_REC)


def main() -> None:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    pid = str(os.getpid())
    for procs in spec.get("cgroups", []):
        try:
            with open(procs, "w") as f:
                f.write(pid)
        except OSError as e:
            _fail(f"cannot join the cgroup {procs}", e.errno)
    for name, value in spec.get("rlimits", {}).items():
        try:
            resource.setrlimit(_RLIMITS[name], (value, value))
        except (OSError, ValueError) as e:
            _fail(f"cannot set the rlimit {name}={value} ({e})")
    if spec.get("stage"):
        stage(spec["stage"], spec["stage_dir"])
    user = spec.get("user")
    if user is not None:
        try:
            os.setgroups([])
            os.setgid(user)
            os.setuid(user)
        except OSError as e:
            _fail(f"cannot become uid {user}", e.errno)
    argv = spec["argv"]
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        _fail(f"cannot run {argv[0]}", e.errno)


if __name__ == "__main__":
    main()
