"""The one exception type that reaches the user as a single line (no traceback)."""


class NplmError(Exception):
    """Bad input or environment: the message says what is wrong and how to fix it."""
