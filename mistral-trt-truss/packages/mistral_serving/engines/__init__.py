"""Engines behind one async interface (`base.Engine`); `select.py` picks one for an artifact."""
