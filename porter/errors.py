"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class PorterError(Exception):
    """A user-facing failure: bad input, missing checkout, refused candidate.

    The message is a single line; the CLI prints `porter: error: <message>` and
    exits with `exit_code`. Anything else escaping is a bug in porter.
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(" ".join(str(message).split()))
        if exit_code is not None:
            self.exit_code = exit_code


class EnvironmentFault(PorterError):
    """The machine cannot build or run the backend (a header missing from the toolkit, a glue file that
    does not compile): never a candidate's failure, so it stops the command instead of being recorded
    as an attempt (exit 2, before any answer is asked for where it can be seen that early)."""
