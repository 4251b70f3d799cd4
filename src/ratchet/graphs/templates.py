"""Templates over a run's input and earlier nodes' outputs, in Jinja2's sandbox.

A string holding ``{{ ... }}`` is a template. A string that is one expression and nothing
else (``"{{ input.accounts }}"``) gives the expression's value itself (a list stays a
list); any other template renders to text. ``when``, ``until`` and ``expression`` fields
are bare expressions (``output.category == 'bug'``). Names: ``input`` (the run's input),
``nodes.<id>.output`` (a node that ran before), ``output`` (on an edge: its source node's
output), ``loop.index`` and the loop's item name (inside a loop body). The sandbox refuses
attribute access to Python internals, and an undefined name is an error, not an empty
string, so a typo fails the node that has it. Templates read data; they cannot change it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ratchet.errors import RatchetError, RetryClass


class _Environment(ImmutableSandboxedEnvironment):
    """Templates cannot change the data they read (``list.append``, ``dict.update`` are
    refused): a node's output is the same wherever it is read, and a replay that takes a
    finished node's output from the journal without rendering its templates sees what the
    first drive saw.

    Jinja looks an ``a.b`` up as an attribute first, so ``nodes.get`` or ``input.items``
    would be the dict's method, not the node or the key. In graph data a key always wins."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)


_ENV = _Environment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.DOTALL)


class TemplateError(RatchetError):
    """A template or expression could not be parsed or evaluated."""

    retry_class = RetryClass.NEVER


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _whole(text: str) -> str | None:
    m = _WHOLE.match(text)
    if m is None or "{{" in m["expr"] or "}}" in m["expr"] or "{%" in text:
        return None
    return m["expr"]


def parse(text: str, expression: bool = False) -> nodes.Template:
    """The template's syntax tree, or :class:`TemplateError` with jinja's reason."""
    source = f"{{{{ {text} }}}}" if expression else text
    try:
        return _ENV.parse(source)
    except TemplateSyntaxError as e:
        raise TemplateError(
            f"bad {'expression' if expression else 'template'} {text!r}: {e.message}"
        ) from None


def references(tree: nodes.Template) -> Iterator[tuple[str, str | None]]:
    """(top-level name, attribute) pairs the tree reads: ``nodes.classify.output`` gives
    ``("nodes", "classify")``; ``nodes['x']`` gives ``("nodes", "x")``."""
    seen: set[int] = set()
    for found in tree.find_all((nodes.Getattr, nodes.Getitem)):
        node: Any = found
        inner = node.node
        if isinstance(inner, nodes.Name):
            seen.add(id(inner))
            if isinstance(node, nodes.Getattr):
                yield inner.name, node.attr
            elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
                yield inner.name, node.arg.value
            else:
                yield inner.name, None
    assigned = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    for name in tree.find_all(nodes.Name):
        if id(name) not in seen and name.ctx == "load" and name.name not in assigned:
            yield name.name, None


@functools.lru_cache(maxsize=1024)
def _compiled_expression(expression: str) -> Any:
    # A graph's few expressions are compiled once, not once per node run or iteration.
    return _ENV.compile_expression(expression, undefined_to_none=False)


@functools.lru_cache(maxsize=1024)
def _compiled_template(source: str) -> Any:
    return _ENV.from_string(source)


def evaluate(expression: str, context: Mapping[str, Any]) -> Any:
    """The value of a bare expression."""
    try:
        return _compiled_expression(expression)(**context)
    except TemplateSyntaxError as e:
        raise TemplateError(f"bad expression {expression!r}: {e.message}") from None
    except Exception as e:
        raise TemplateError(f"expression {expression!r} failed: {type(e).__name__}: {e}") from None


def render(value: Any, context: Mapping[str, Any]) -> Any:
    """``value`` with every template in it rendered (recursively through lists and dicts)."""
    if isinstance(value, str):
        if not is_template(value):
            return value
        expr = _whole(value)
        if expr is not None:
            return _plain(evaluate(expr, context))
        try:
            return _compiled_template(value).render(**context)
        except TemplateSyntaxError as e:
            raise TemplateError(f"bad template {value!r}: {e.message}") from None
        except Exception as e:
            raise TemplateError(f"template {value!r} failed: {type(e).__name__}: {e}") from None
    if isinstance(value, list):
        return [render(v, context) for v in value]
    if isinstance(value, dict):
        return {k: render(v, context) for k, v in value.items()}
    return value


def _plain(value: Any) -> Any:
    """An expression's value as JSON data: jinja's undefined and tuples become JSON."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def check(value: Any, expression: bool = False) -> Iterator[tuple[str, nodes.Template]]:
    """Parse every template in ``value``: (path inside value, tree) pairs; raises
    :class:`TemplateError` (with the path in ``.path``) on the first bad one."""
    yield from _check(value, "", expression)


def _check(value: Any, path: str, expression: bool) -> Iterator[tuple[str, nodes.Template]]:
    if isinstance(value, str):
        if expression:
            yield path, parse(value, expression=True)
        elif is_template(value):
            yield path, parse(value)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _check(v, f"{path}[{i}]", expression)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _check(v, f"{path}.{k}", expression)
