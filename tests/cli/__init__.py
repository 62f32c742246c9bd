"""`tokendiff` from the shell: exit codes, output, one-line errors and goldens (helpers.run_cli, call_main)."""
