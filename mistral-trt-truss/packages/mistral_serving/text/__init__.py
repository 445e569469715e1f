"""Text: the artifact's tokenizer, chat formatting, incremental detokenizing and streaming
(stop strings, throttling)."""
