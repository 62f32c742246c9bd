"""Against real peers: llama-server, vLLM's CPU build, the proxy as a child process, Chromium."""
