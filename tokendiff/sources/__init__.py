"""Sources: files to Prompts (slot files, captures, importers of HAR files, request bodies and prompt logs,
tokenizer files, chat templates, recorded streams).

May import: tokendiff.core and the shared leaves (errors, notices, safeio, paths, config); never a server
client (a live server is handed in by the application layer, as the loader's PromptServer).
"""
