"""The Textual TUI: the app, its screens (screens/) and widgets (widgets/). Imported only by `tokendiff`,
`tokendiff tui` and `tokendiff watch`. Reaches sources and backends only through the application layer."""
