"""Errors raised by tidegate.

Every error tidegate raises derives from one base, so callers can catch them all::

    TidegateError
    ├── ConfigError          a setting, workloop spec or lane chain is malformed
    ├── SchemaError          the database schema is older or newer than this code
    ├── EnqueueError         an enqueue was malformed (args, lane, priority)
    └── UnknownTaskError     a run names a task that is not registered
"""

from __future__ import annotations


class TidegateError(Exception):
    """Base of every error tidegate raises."""


class ConfigError(TidegateError, ValueError):
    """A setting, workloop spec or lane chain is malformed; the message names the bad part."""


class SchemaError(TidegateError):
    """The database schema does not match this version of tidegate."""


class UnknownTaskError(TidegateError, LookupError):
    """A run or an enqueue names a task that this app has not registered."""


class EnqueueError(TidegateError, ValueError):
    """An enqueue was malformed: args not a JSON object, a bad lane name or priority."""
