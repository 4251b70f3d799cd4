"""Several versions of a workflow in one app: which one a start takes, and which one drives
a run.

An app may register ``@app.workflow(name="checkout", version="2")`` beside version 1. A
start of ``checkout`` takes the newest version (:func:`version_key`: ``"10"`` after
``"9"``, ``"1.10"`` after ``"1.9"``); ``checkout@1`` names one. A run keeps the version it
was started with (``runs.workflow_version``), and a worker drives it with the definition of
that version only (:func:`definition_for`): a worker without it never claims the run (it
claims only the ``(workflow, version)`` pairs it serves), and a drive that reaches one
anyway fails as a run of an unknown workflow does, rather than running other code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Protocol, runtime_checkable

from ratchet.engine.definitions import WorkflowDef
from ratchet.errors import InvalidInput, UnknownWorkflow

# What separates a workflow's name from a version in a start: ``checkout@2``.
AT = "@"

# A version's parts: runs of digits, and runs of anything else but the separators . - _ +
_PARTS = re.compile(r"\d+|[^\d.\-_+]+")

VersionKey = tuple[tuple[tuple[int, int, str], ...], str]


def version_key(version: str) -> VersionKey:
    """The sort key of a version, natural order: runs of digits compare as numbers, the rest
    as text, part by part (``"2" < "9" < "10"``, ``"1.9" < "1.10"``, ``"1" < "1.1"``,
    ``"v9" < "v10"``). Text sorts before a number at the same place (``"1.rc1" <
    "1.0"``); leading zeros and the separators break ties only (``"01"`` before ``"1"``),
    so distinct versions never compare equal."""
    parts = tuple(
        (1, int(part), part) if part.isdigit() else (0, 0, part) for part in _PARTS.findall(version)
    )
    return parts, version


def split_ref(ref: str) -> tuple[str, str | None]:
    """``"checkout@1"`` → ``("checkout", "1")``; ``"checkout"`` → ``("checkout", None)``."""
    name, at, version = ref.partition(AT)
    return name, (version if at else None)


def check_workflow_name(name: str) -> str:
    """``name`` unless it holds ``@``, which a start reads as ``name@version``."""
    if AT in name:
        raise InvalidInput(
            f"invalid workflow name {name!r}: '@' separates a workflow's name from a version "
            f"in a start (checkout@2); give the version as version=... instead"
        )
    return name


@runtime_checkable
class Versioned(Protocol):
    """Workflows by name that hold more than one version of a name (an app's
    :class:`WorkflowRegistry`, and what a worker of the app drives)."""

    def every(self) -> list[WorkflowDef]:
        """Every version of every workflow."""
        ...

    def version_of(self, name: str, version: str) -> WorkflowDef | None:
        """Workflow ``name`` at ``version``; None when there is none."""
        ...


def every_version(workflows: Mapping[str, WorkflowDef]) -> list[WorkflowDef]:
    """Every definition ``workflows`` holds: each version of each name."""
    if isinstance(workflows, Versioned):
        return workflows.every()
    return list(workflows.values())


def definition_for(
    workflows: Mapping[str, WorkflowDef], name: str, version: str
) -> WorkflowDef | None:
    """The definition a run of ``name`` at ``version`` is driven with: that version's,
    never another's; None when ``workflows`` lacks it."""
    if isinstance(workflows, Versioned):
        return workflows.version_of(name, version)
    wd = workflows.get(name)
    return wd if wd is not None and wd.version == version else None


def missing(workflows: Mapping[str, WorkflowDef], name: str, version: str) -> str:
    """Why a drive of ``name`` at ``version`` finds no definition in ``workflows``."""
    have = sorted(
        (wd.version for wd in every_version(workflows) if wd.name == name), key=version_key
    )
    if not have:
        return f"workflow {name!r} is not registered with this worker"
    return (
        f"workflow {name!r} version {version!r} is not registered with this worker "
        f"(it has version{'s' if len(have) > 1 else ''} {', '.join(have)})"
    )


class WorkflowRegistry(MutableMapping[str, WorkflowDef]):
    """An app's code workflows: by name, the newest version (what a start of the name
    takes); ``name@version`` gives that version. Iterating gives each name once. Setting
    ``registry[name] = wd`` registers ``wd`` beside the other versions (:meth:`add`);
    :meth:`update` takes every version of another app's workflows."""

    def __init__(self) -> None:
        self._versions: dict[str, dict[str, WorkflowDef]] = {}
        self._newest: dict[str, WorkflowDef] = {}

    def add(self, wd: WorkflowDef) -> None:
        """Register ``wd`` beside the other versions of its name. The same version of a name
        twice is refused (unless it is the same function again: a module imported twice)."""
        check_workflow_name(wd.name)
        versions = self._versions.setdefault(wd.name, {})
        known = versions.get(wd.version)
        if known is not None and known.fn is not wd.fn:
            raise InvalidInput(
                f"workflow {wd.name!r} version {wd.version!r} is already registered; "
                "a new version of it takes another version=..."
            )
        versions[wd.version] = wd
        self._newest[wd.name] = max(versions.values(), key=lambda d: version_key(d.version))

    def versions(self, name: str) -> list[WorkflowDef]:
        """The versions of ``name``, oldest first (empty when there is none)."""
        return sorted(self._versions.get(name, {}).values(), key=lambda d: version_key(d.version))

    def every(self) -> list[WorkflowDef]:
        return [wd for name in self._versions for wd in self.versions(name)]

    def version_of(self, name: str, version: str) -> WorkflowDef | None:
        return self._versions.get(name, {}).get(version)

    def resolve(self, ref: str) -> WorkflowDef:
        """The workflow ``ref`` names: ``name`` (its newest version) or ``name@version``;
        :class:`UnknownWorkflow` naming what there is otherwise."""
        wd = self.get(ref)
        if wd is not None:
            return wd
        name, version = split_ref(ref)
        have = self.versions(name)
        if version is not None and have:
            raise UnknownWorkflow(
                f"unknown workflow {ref!r}: workflow {name!r} has no version {version!r}; "
                f"its versions: {', '.join(d.version for d in have)}"
            )
        known = ", ".join(sorted(self)) or "none"
        raise UnknownWorkflow(f"unknown workflow {ref!r}; registered workflows: {known}")

    def __getitem__(self, ref: str) -> WorkflowDef:
        if not isinstance(ref, str):
            raise KeyError(ref)
        wd = self._newest.get(ref)
        if wd is not None:
            return wd
        name, version = split_ref(ref)
        found = None if version is None else self.version_of(name, version)
        if found is None:
            raise KeyError(ref)
        return found

    def __setitem__(self, ref: str, wd: WorkflowDef) -> None:
        if ref not in (wd.name, f"{wd.name}{AT}{wd.version}"):
            raise InvalidInput(f"workflow {wd.name!r} version {wd.version!r} set as {ref!r}")
        self.add(wd)

    def __delitem__(self, ref: str) -> None:
        """Forget ``name`` (every version) or ``name@version`` (that one)."""
        name, version = split_ref(ref)
        versions = self._versions.get(name)
        if versions is None or (version is not None and version not in versions):
            raise KeyError(ref)
        if version is None:
            versions.clear()
        else:
            del versions[version]
        if versions:
            self._newest[name] = max(versions.values(), key=lambda d: version_key(d.version))
        else:
            del self._versions[name], self._newest[name]

    def update(self, other: Mapping[str, WorkflowDef], /) -> None:  # type: ignore[override]
        """Register every version ``other`` holds (another app's workflows)."""
        for wd in every_version(other):
            self.add(wd)

    def __iter__(self) -> Iterator[str]:
        return iter(self._newest)

    def __len__(self) -> int:
        return len(self._newest)
