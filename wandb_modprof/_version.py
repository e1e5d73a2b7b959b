"""The package version, in one place (the profile file and the report name it)."""

__version__ = "0.1.0"
