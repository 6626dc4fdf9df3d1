"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class KzttsError(Exception):
    """A problem with the user's input (file, value, option) that they can fix."""


class BundleError(KzttsError):
    """A bundle directory is missing, incomplete, corrupt, or of another model type."""


class ContextOverflowError(KzttsError):
    """A prompt or generation would not fit the graph's context length."""


def signal_note(signal: int) -> str:
    """How a child process ended on ``signal``, for error messages."""
    # SIGKILL out of the blue is the OOM killer, usually
    return f"killed by signal {signal}" + (" (out of memory?)" if signal == 9 else "")
