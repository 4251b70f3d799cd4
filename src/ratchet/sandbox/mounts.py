"""What a sandbox sees of the host: the mounts of its bubblewrap command line.

* **The interpreter**, read-only: the installation's prefixes (the base one and the virtual
  environment's), its site-packages, and the system's shared libraries.
* **The app's code**, read-only: for each module this process has imported from outside
  the interpreter's paths, the folder of its top-level package, or the module's own file
  for a module that is in no package. Never the folder a module merely sits in, so never
  the working directory as such: ``ratchet server --app agents:app`` started next to
  ``agents.py`` shows the sandbox ``agents.py`` and nothing else of that folder. A package
  whose folder is the working directory or holds it is shown module file by module file.
* **Masks** over what must stay unseen even where a mounted path holds it: Ratchet's
  private paths (the data directory, the SQLite database and its ``-wal``, ``-shm`` and
  ``-journal`` files, the signing key, the worker's log files) and the working directory.
  A folder gets an empty read-only tmpfs, a file ``/dev/null``. Code inside the working
  directory is mounted again on top of its mask.

Code that would sit inside one of Ratchet's private folders is refused (the data
directory must stay apart from the code a sandbox imports), as is a ``Sandbox(mounts=...)``
path inside one.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ratchet.errors import SandboxUnavailable

# The system's shared libraries and the loader; /bin and /sbin are left out (a workload
# gets the interpreter, not a shell).
SYSTEM_PATHS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32")


def covered(path: str, by: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``by`` or inside one."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in by)


def minimal(paths: Iterable[str]) -> list[str]:
    """Paths without duplicates or paths inside others, shortest first."""
    kept: list[str] = []
    for p in sorted(set(paths), key=len):
        if not covered(p, kept):
            kept.append(p)
    return kept


def place(path: str) -> str:
    """Where ``path`` appears in a sandbox: the real path of its folder, and its own name
    (a module file or package folder that is a link keeps the name Python looks for)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def interpreter_paths() -> list[str]:
    """The interpreter's installation: its prefixes, its standard library and its
    site-packages, as they exist here."""
    paths = {
        sys.base_prefix,
        sys.prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        *site.getsitepackages(),
    }
    if site.ENABLE_USER_SITE:
        paths.add(site.getusersitepackages())
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        paths.add(sysconfig.get_path(name))
    return [os.path.realpath(p) for p in paths if p and os.path.exists(p)]


def import_path() -> list[str]:
    """This process's import path, for the sandbox's ``PYTHONPATH``: names only, nothing
    is mounted for it."""
    return [os.path.realpath(p or os.getcwd()) for p in sys.path if isinstance(p, str)]


def _files_under(folder: str) -> list[str]:
    """The imported modules' files inside ``folder``."""
    found = []
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.isfile(file) and covered(place(file), [folder]):
            found.append(place(file))
    return found


def module_paths(cwd: str) -> list[str]:
    """The app's code as this process imported it: each top-level package's folder, or a
    module's file; a package whose folder is ``cwd`` or holds it, by its module files."""
    found: set[str] = set()
    tops: set[str] = set()
    for name in list(sys.modules):
        top = name.partition(".")[0]
        if top in tops:
            continue
        tops.add(top)
        module = sys.modules.get(top)
        if module is None:
            continue
        locations = getattr(module, "__path__", None)
        if locations is not None:  # a package (or a namespace package's folders)
            for folder in list(locations):
                if not isinstance(folder, str) or not os.path.isdir(folder):
                    continue
                folder = place(folder)
                found.update(_files_under(folder) if covered(cwd, [folder]) else [folder])
            continue
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.isfile(file):
            found.add(place(file))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class Op:
    """One mount: ``bind`` ``source`` at ``path`` read-only; ``tmpfs`` (an empty folder)
    or ``null`` (an empty file) over ``path``; ``ro``: make the tmpfs at ``path``
    read-only, once what goes inside it is mounted."""

    kind: str
    path: str
    source: str = ""


@dataclass(slots=True)
class Plan:
    """A sandbox's mounts, in the order bubblewrap makes them."""

    ops: list[Op] = field(default_factory=list)

    @property
    def sources(self) -> list[str]:
        return [op.source for op in self.ops if op.kind == "bind"]


def plan(
    interpreter: Sequence[str],
    code: Sequence[str],
    mounts: Sequence[str],
    private: Sequence[str],
    cwd: str,
    system: Sequence[str] = (),
) -> Plan:
    """The mounts of a sandbox (see the module docstring). ``interpreter``, ``code`` and
    the user's ``mounts`` are shown; ``private`` paths and ``cwd`` are masked wherever a
    shown path holds them; ``system`` paths are mounted already (they hold nothing
    private, but what they hold needs no mount of its own). Raises
    :class:`SandboxUnavailable` for code or a mount that a mask would cover."""
    cwd = os.path.realpath(cwd)
    shown = [os.path.realpath(p) for p in [*interpreter, *mounts]]
    if cwd in [os.path.realpath(p) for p in interpreter]:
        raise SandboxUnavailable(
            f"the worker's working directory {cwd} is the "
            "interpreter's own folder: start it from another one"
        )
    outer = [p for p in minimal(shown) if not covered(p, system)]
    top_code = [p for p in minimal(code) if not covered(p, [*outer, *system])]
    every = [*system, *outer, *top_code]
    hide_cwd = covered(cwd, every)
    # Under the working directory's mask, everything shown inside it comes again.
    inside = (
        minimal([p for p in [*shown, *code] if covered(p, [cwd]) and p != cwd]) if hide_cwd else []
    )
    masks: list[str] = []
    for p in sorted({os.path.realpath(p) for p in private}, key=len):
        if p == cwd or not os.path.exists(p) or covered(p, masks):
            continue  # the working directory has a mask of its own (or is not shown)
        if not covered(p, inside if hide_cwd and covered(p, [cwd]) else every):
            continue  # not shown anyway
        masks.append(p)
    for folder in (m for m in masks if os.path.isdir(m)):
        for what, paths in (("the mount", mounts), ("the app's code at", code)):
            for q in paths:
                if covered(os.path.realpath(q), [folder]):
                    raise SandboxUnavailable(
                        f"{what} {q} is inside {folder}, which holds Ratchet's own files "
                        "(the data directory: the signing key, the database, logs): keep "
                        "RATCHET_DATA_DIR apart from the code and mounts a sandbox reads"
                    )
    result = Plan()
    for p in [*outer, *top_code]:  # parents before what they hold
        if not (hide_cwd and covered(p, [cwd])):
            result.ops.append(Op("bind", p, os.path.realpath(p)))
    if hide_cwd:
        result.ops.append(Op("tmpfs", cwd))
        result.ops.extend(Op("bind", p, os.path.realpath(p)) for p in inside)
    result.ops.extend(Op("tmpfs" if os.path.isdir(p) else "null", p) for p in masks)
    result.ops.extend([Op("ro", op.path) for op in result.ops if op.kind == "tmpfs"])
    return result


def log_files() -> list[str]:
    """The files this process logs to: its standard output and error when they are files
    (``ratchet server ... > server.log``), and every logging file handler's."""
    import logging

    found = []
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and os.path.isfile(target):
            found.append(target)
    loggers = [
        logging.getLogger(),
        *(
            lg
            for lg in logging.Logger.manager.loggerDict.values()
            if isinstance(lg, logging.Logger)
        ),
    ]
    for lg in loggers:
        for handler in lg.handlers:
            if isinstance(handler, logging.FileHandler):
                found.append(handler.baseFilename)
    return found
