"""The serving layer: requests become engine jobs, engine output becomes LMSP events, events are stored.

`service` runs one response (prompt, job, events), `responder` adds storage and idempotency to it,
`conversations` rebuilds a history from `previous_response_id`, `tasks` runs durable background
responses and `recovery` ends what a crash interrupted. `running` is what tasks and the responder
need of the service (a protocol a fake can play in tests), `storage` says what each store failure
means to a client. No HTTP and no SQL: the store's repositories do the SQL, `http/` does the HTTP.
"""
