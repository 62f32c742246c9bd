"""The TUI's screens: the session, a pair, the help overlay. Each imports widgets and the application layer."""
