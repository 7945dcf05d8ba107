"""A run refused before it starts, for a reason its operator must act on (another run
drives it, its stored progress is gone): the message says what was found and what to do,
so the command line shows it alone, in one line, without a traceback."""


class RunRefusedError(RuntimeError):
    """The run must not start as asked; the message names the run, what was found, and how
    to go on."""
