"""The Textual TUI. Imported only by `tokendiff` / `tokendiff tui`."""
