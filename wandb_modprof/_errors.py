"""The one exception type the package raises at its public boundary."""


class ModProfError(Exception):
    """Raised for misuse of the public API: says what was expected, what was got, and where."""
