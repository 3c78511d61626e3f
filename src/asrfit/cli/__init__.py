"""Thin command-line commands: parse, call the library, print."""
