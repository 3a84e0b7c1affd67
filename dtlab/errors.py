"""The one error type users see: a single line that says what is wrong, where, and the fix."""


class DtlabError(Exception):
    """Bad input or an unusable environment, detected before anything starts.

    The message is one line, e.g. ``experiments/matrix.yml: profiles.smoke.epochs: must be >= 1, got 0``.
    tasks.py prints it without a traceback and exits 2.
    """

    exit_code = 2
