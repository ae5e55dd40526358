"""The one client for lmsp-tray's loopback HTTP and SSE, for every process that is not the service.

Why a package of its own: apps (`lmsp_tray.connect`), the command line (`lmsp_tray.cli`) and a
second launch all talk to the running service with a bearer token in hand. The rule that keeps
that token on this machine — loopback URLs only, never through a proxy, no redirect elsewhere —
is written once, in `loopback`; `sse` is the one reader of an event stream; `finding` is the one
way to find this home's running service. Standard library only: apps import `connect` without
the service's dependencies.
"""
