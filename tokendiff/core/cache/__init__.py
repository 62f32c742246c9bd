"""What each engine can reuse of a prompt, given what it held: llama-server's checkpoints for sliding-window
and hybrid models, capacity-limited caches, and what a backend did to a session (reloads, cuts, blocks).
Pure, like the rest of the core."""
