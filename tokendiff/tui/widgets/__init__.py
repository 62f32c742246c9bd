"""The TUI's widgets: the token view, the session table and chart, the footer, and their view models.
They draw what they are given and import no application code."""
