"""The HTTP layer: the only code that imports Starlette and knows about requests and responses.

Routes parse a request into protocol objects, call `serving/`, and turn what comes back into JSON
bodies, server-sent events or problem documents; `security` checks Host, Origin, body size and the
bearer token with its scopes before any route runs.
"""
