"""The application layer: the workflows the CLI and the TUI share (a pair, a session, a fleet, reports,
replay, doctor, the live proxy and slot feeds). Plain options in, typed results out; nothing here prints
(warnings go through tokendiff.notices) or knows about Textual.

May import: tokendiff.report, tokendiff.backends, tokendiff.sources, tokendiff.core and the shared leaves.
The faces (cli, tui) reach sources and backends only through here.
"""
