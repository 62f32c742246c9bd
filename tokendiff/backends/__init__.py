"""Backends: the only code that speaks to servers (llama-server, vLLM, SGLang, Ollama): probes, clients,
the recording proxy, pull, replay, doctor's probes, a live server's tokenizer.

May import: tokendiff.sources, tokendiff.core and the shared leaves; not tokendiff.report.
"""
