"""Speech recognition end to end: audio, text, features, the built-in model, training runs."""
