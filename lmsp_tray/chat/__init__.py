"""The chat layer between the protocol and the engine: tools, structured output and reasoning.

It decides how function tools and earlier calls reach a model (its own chat
template or a built-in instruction), which GBNF grammar constrains decoding
(JSON Schema for structured output and call arguments, the family's call
syntax, an optional thinking block), and how the model's text comes back as
`reasoning`, `message` and `function_call` items. Nothing here imports
llama.cpp or Starlette; the engine runs the grammar, the service wires it up.
"""
