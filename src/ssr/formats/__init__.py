"""Text: thinking formats (markers, answer prefixes, chat templates), streamed detokenisation
and runaway-repetition guards, tool calls."""
