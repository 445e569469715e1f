"""The command-line help style every `python -m client ...` command shares (kept apart from
the commands so that none of them imports another for it)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every option's default, and keeps the description's line breaks."""
