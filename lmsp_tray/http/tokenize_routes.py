"""`POST /lmsp/v1/models/{id}/tokenize`, `/detokenize` and `/apply-template` (scope `responses:create`).

Why: llama-server's `/tokenize`, `/detokenize` and `/apply-template`, per
model: apps count tokens before sending, and check the prompt a model reads.
The model is loaded on demand; its own process tokenizes (`serving.tokenize`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from lmsp_tray.http.api import Scoped
from lmsp_tray.http.routes import JSON, read_json
from lmsp_tray.protocol.tokenize import parse_apply_template, parse_detokenize, parse_tokenize
from lmsp_tray.serving import tokenize as tokenizer
from lmsp_tray.serving.service import Service


def _service(request: Request) -> Service:
    return request.app.state.service


async def tokenize(request: Request) -> Response:
    body = parse_tokenize(await read_json(request))
    return JSON(await tokenizer.tokenize(_service(request), request.path_params["model_id"], body))


async def detokenize(request: Request) -> Response:
    body = parse_detokenize(await read_json(request))
    return JSON(await tokenizer.detokenize(_service(request), request.path_params["model_id"], body))


async def apply_template(request: Request) -> Response:
    body = parse_apply_template(await read_json(request))
    return JSON(await tokenizer.apply_template(_service(request), request.path_params["model_id"], body))


TOKENIZE_ROUTES = [
    Scoped("/models/{model_id:path}/tokenize", tokenize, POST="responses:create"),
    Scoped("/models/{model_id:path}/detokenize", detokenize, POST="responses:create"),
    Scoped("/models/{model_id:path}/apply-template", apply_template, POST="responses:create"),
]
