"""The Textual apps driven headless by the pilot, and their SVG snapshots (tests/tui/__snapshots__/)."""
