"""The HTTP layer: the only code that imports Starlette and knows about requests and responses.

`api.Api` mounts an API under its path (`/lmsp/v1`): routes that declare the scope each method
needs and the shape its errors take. Routes parse a request into protocol objects (a large body on
a worker thread, a big one in a worker process), call `serving/`, and turn what comes back into JSON bodies, server-sent events
or problem documents; `security` checks Host, Origin, body size and the bearer token with the
route's scope before any route runs.
"""
