"""Objects a scenario names as ``package.module:name`` (a custom data kind, model, algorithm or
aggregator): imported, and checked to take the arguments raysim passes, with one error line that
blames the scenario key; what the user's code raises (or a ``sys.exit`` in it) is that line too.

Ground floor: imports nothing of raysim but :mod:`raysim.errors`, and nothing heavy itself (the
user's module imports what it needs).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import traceback

from raysim.errors import ScenarioError, raised

USER_CODE_ERRORS = (Exception, SystemExit)  # what a user's module may raise while imported or called


def import_object(path: str, target: str, what: str):
    """The object that ``target`` (``package.module:name``) names; the scenario key ``path`` is
    blamed, with ``what`` the kind of object expected, when it cannot be imported."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ScenarioError(path, target, f"a built-in name or package.module:name of {what}")
    if os.getcwd() not in sys.path:  # as `python -m` does: modules of the directory the run starts in
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except USER_CODE_ERRORS as exc:  # the user's module may fail in any way while importing, or exit
        happened = f"it calls sys.exit({exc.code!r}) when imported" if isinstance(exc, SystemExit) else raised(exc)
        raise ScenarioError(path, target, f"an importable module ({happened})") from None
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise ScenarioError(path, target, f"a name that module {module_name} defines ({what})") from None


def import_callable(path: str, target: str, what: str, allowed: str, *args, **kwargs):
    """``import_object(path, target, what)``, checked to take ``(*args, **kwargs)``: otherwise one
    error line that blames ``path`` and says what is ``allowed``."""
    function = import_object(path, target, what)
    try:
        inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:  # ValueError: not a function, or one without a signature
        raise ScenarioError(path, target, f"{allowed} ({exc})") from None
    return function


def call_imported(path: str, target: str, what: str, *args, **kwargs):
    """``import_object(path, target, what)(*args, **kwargs)``; ``path`` is blamed when the object
    cannot take those arguments, and when it raises (the line says what it raised, and where)."""
    taking = ", ".join([f"{len(args)} positional arguments"] * bool(args) + [f"{k}=" for k in kwargs])
    function = import_callable(path, target, what, f"{what}, called with {taking}", *args, **kwargs)
    try:
        return function(*args, **kwargs)
    except USER_CODE_ERRORS as exc:
        raise ScenarioError(path, target, f"{what} ({raised_in(exc)})") from None


def raised_in(exc: BaseException) -> str:
    """'it raised ValueError: no rows, at my_data.py:12' (or 'it called sys.exit(1), at …'): what a
    user's function raised, and the line of the innermost frame it came from (the user's code, or
    what that code called)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f", at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    happened = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"raised {raised(exc)}"
    return f"it {happened}{where}"
