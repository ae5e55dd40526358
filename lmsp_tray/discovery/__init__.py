"""Model discovery: find GGUF models where users already keep them and describe them.

`sources` says where to look, `scan` walks those folders (and Ollama's store)
and reads headers, `catalog.Catalog` turns what was found into stable model ids.
"""
