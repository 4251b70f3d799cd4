"""What every command of the ``ratchet`` command shares: its ``--db`` and ``--json``
options, the one-line failures, the client on the chosen database, and loading a user's
app from ``module:attribute``."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperGroup

from ratchet.app import Ratchet
from ratchet.config import DEFAULT_DATABASE_URL, DatabaseURL
from ratchet.errors import InvalidInput, RatchetError
from ratchet.names import parse_tag

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="Database URL (sqlite:///path or postgresql://...); default: "
        f"$RATCHET_DATABASE_URL, else {DEFAULT_DATABASE_URL}.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
RunArg = Annotated[str, typer.Argument(metavar="RUN_ID", help="A run id.")]
GrantOption = Annotated[
    str | None,
    typer.Option(
        "--grant",
        metavar="JSON",
        help="Limits the run may go over to, e.g. "
        "'{\"budget_tokens\": 5000}' (budget_tokens, budget_usd, budget_steps, budget_wall_s, "
        "max_steps, timeout_s; null for off). Journaled with who granted it.",
    ),
]


def _no_type(ctx: Any) -> None:
    return None


def readable(params: list[Any]) -> list[Any]:
    """``params`` (a command's, its ``--help`` included), their help naming each value by
    its metavar alone: typer prints the Python type beside an argument's name
    (``RUN_ID <str>``) and beside a flag, which takes no value (``--json <bool>``). An
    option's metavar already replaces its type."""
    for param in params:
        if isinstance(param, TyperArgument) or getattr(param, "is_flag", False):
            # On the instance: typer has no setting for it, and the classes are its own.
            setattr(param, "display_type_rich", _no_type)  # noqa: B010
    return params


class ReadableGroup(TyperGroup):
    """The class of every ``ratchet`` command group: its own parameters and its
    commands' are :func:`readable`."""

    def get_params(self, ctx: Any) -> list[Any]:  # ctx: a click Context
        return readable(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            readable(command.get_params(ctx))
        return command


class Fail(Exception):
    """A clear, expected failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def die(message: str, code: int = 2) -> NoReturn:
    """Print ``error: <message>`` on one line of stderr and exit with ``code``."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
# Loggers of the HTTP clients that log every request at INFO: httpx, and httpx2, which
# the OpenAI and Anthropic SDKs send their requests through since their 2.x releases.
# Shown at DEBUG only.
CHATTY_LOGGERS = ("httpx", "httpx2")


def configure_logging(log_level: str) -> int:
    """Log to stderr at ``log_level`` (DEBUG, INFO, WARNING or ERROR) in the house format;
    a per-request INFO line of an HTTP client only at DEBUG. Exits 2 on an unknown level."""
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        die(f"invalid --log-level {log_level!r}: expected DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)
    return level


def make_console() -> Console:
    """The console commands print tables and user data on."""
    # No markup and no emoji codes: what is printed is user data, shown as typed.
    plain: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}
    # Piped output is not cut to 80 columns: a run id must survive `| grep`.
    if sys.stdout.isatty():
        return Console(**plain)
    return Console(**plain, width=int(os.environ.get("COLUMNS") or 200))


def given_db(ctx: typer.Context, db: str | None) -> str | None:
    """The command's --db, else the one given before the command, else None."""
    root = ctx.find_root().obj
    return db or (root if isinstance(root, str) else None)


def db_url(ctx: typer.Context, db: str | None) -> str:
    """The database the command works on: --db, else $RATCHET_DATABASE_URL, else the
    default."""
    return given_db(ctx, db) or os.environ.get("RATCHET_DATABASE_URL") or DEFAULT_DATABASE_URL


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """Turn expected failures into one line on stderr and an exit code."""
    try:
        yield
    except Fail as e:
        die(str(e), e.code)
    except RatchetError as e:
        die(str(e))
    except KeyboardInterrupt:
        die("interrupted", 130)


@contextlib.contextmanager
def client(ctx: typer.Context, db: str | None, read_only: bool = False) -> Iterator[Ratchet]:
    """A Ratchet client on the chosen database, shut down afterwards. ``read_only`` for
    the commands that only read: they never create a database."""
    with errors():
        app = Ratchet(db_url(ctx, db), read_only=read_only)
        try:
            yield app
        finally:
            app.shutdown()


@contextlib.contextmanager
def app_on_db(ctx: typer.Context, spec: str, db: str | None) -> Iterator[Ratchet]:
    """The app ``spec`` names (``module:attribute``, see :func:`load_app`), on the
    command's --db where one is given (else on its own database), shut down afterwards."""
    app = load_app(spec)
    try:
        url = given_db(ctx, db)
        if url is not None:
            DatabaseURL.parse(url)
            app.database_url = url
        yield app
    finally:
        app.shutdown()


def json_option(flag: str, text: str | None, default: Any) -> Any:
    """The JSON an option was given, ``default`` when it was not given; exit 2 naming
    ``flag`` when it is not JSON."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError as e:
        die(f"{flag} is not JSON: {e}")


def tag_option(given: list[str] | None) -> dict[str, str]:
    """``--tag KEY=VALUE`` options as one mapping, or exit 2 naming the problem (a tag
    given twice with different values is one: a run has one value per tag)."""
    tags: dict[str, str] = {}
    for text in given or []:
        try:
            key, value = parse_tag(text)
        except InvalidInput as e:
            die(f"--tag: {e}")
        if tags.setdefault(key, value) != value:
            die(f"--tag: {key!r} given twice with different values (a run has one value per tag)")
    return tags


def grant_option(text: str | None) -> dict[str, Any] | None:
    """``--grant``'s JSON, or exit 2 naming the problem."""
    if text is None:
        return None
    try:
        grant = json.loads(text)
    except json.JSONDecodeError as e:
        die(f"--grant is not JSON: {e}")
    if not isinstance(grant, dict):
        die(f"--grant must be a JSON object of limits to new values, got {text}")
    return grant


def load_app(spec: str) -> Ratchet:
    """``module:attribute`` (importable from the current directory) → the Ratchet app."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise Fail(f"invalid APP {spec!r}: expected module:attribute, e.g. myproject.workflows:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise Fail(
                f"cannot import module {module_name!r} for APP {spec!r}: "
                f"no module named {e.name!r} (looked in the current directory "
                "and on sys.path)"
            ) from e
        raise Fail(f"importing module {module_name!r} failed: {_where(e)}") from e
    except Exception as e:
        raise Fail(f"importing module {module_name!r} failed: {_where(e)}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise Fail(f"module {module_name!r} has no attribute {attr!r} (APP {spec!r})")
        obj = getattr(obj, part)
    if not isinstance(obj, Ratchet):
        raise Fail(f"APP {spec!r} is a {type(obj).__name__}, not a ratchet.Ratchet app")
    return obj


def _where(e: BaseException) -> str:
    """``Type: message (file:line)`` of the innermost frame, so one line says enough."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = ""
    if tb is not None:
        where = f" ({os.path.relpath(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})"
    return f"{type(e).__name__}: {e}{where}"
