"""Structured output: response_format and tool-call schemas checked, priced and compiled
(in killable worker processes) before any engine sees them."""
