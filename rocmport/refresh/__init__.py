"""Refresh: carry the port to a new upstream release.

The refresh engine (engine), the staged copy of a series it edits (staging), what it tells a
reviewer (report), the summary files (summary), and the bot that runs one refresh per release (bot)."""
