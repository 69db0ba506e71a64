"""What every ``flask defer`` command shares: who it is in the history, errors → exit codes."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from ..errors import DeferError, InvalidArgument

C = TypeVar("C", bound=Callable[..., Any])

#: Who a CLI command is in the job history.
CLI_ACTOR = "cli"


def errors_to_exit_codes(command: C) -> C:
    """Turn the facade's errors into click's: bad input exits 2, a refusal exits 1."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except InvalidArgument as error:
            raise click.UsageError(str(error)) from None
        except DeferError as error:
            raise click.ClickException(str(error)) from None

    return wrapper  # type: ignore[return-value]
