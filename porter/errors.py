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
