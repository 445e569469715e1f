"""Engines behind one async interface (`base.Engine`); `factory.py` picks one for an artifact."""
