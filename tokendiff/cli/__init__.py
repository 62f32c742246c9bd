"""The command line: parsers, commands, exit codes. Imports the application layer, the renderers and the TUI
(which `tokendiff tui` and `watch` start), never sources or backends directly."""
