"""Who may call the API: bearer tokens and their scopes, app pairing, and the OS keyring.

`tokens` issues, checks and revokes tokens (only hashes are stored), `pairing` lets an app ask for
a token that the person approves, and `vault` keeps secrets in the OS keyring, never in a file.
"""
