"""LMSP's wire vocabulary, free of any transport: request bodies (pydantic, at the edge) and the
events and response objects a generation produces (`events.ResponseAssembler`).
"""
