"""The one exception type that the CLI turns into a one-line message."""


class KdmlError(ValueError):
    """Bad input from the user: the message says what was wrong and what to do."""


class QuietExit(KdmlError):
    """A failure that another process (rank 0 under torchrun) reports; this one stops without
    printing it again."""
