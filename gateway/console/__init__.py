"""The operator console at /_gateway/console/ (docs/console.md): the fleet, mounts, jobs,
users and keys, and what of a prefix is cached, as pages every node serves to admin keys."""

from .routes import PREFIX, Console, is_console_path

__all__ = ["PREFIX", "Console", "is_console_path"]
