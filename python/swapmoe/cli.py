"""Command line: ``swapmoe bench|check`` (placeholder replaced below)."""


def main(argv=None) -> int:
    return 0
