"""The HTTP API of `dsh serve` (docs/server.md): a FastAPI application over one `Runtime`.

Layer: server, an adapter above every service layer. It holds no business logic: routes call the
runtime's services and translate their errors through one status table. Only `dsh serve`, this
package and `dsh.testing` (`server`, `fake_openai`) import fastapi and uvicorn; `import dsh`
never does.

Modules: `app` (`create_app`), `errors` (`WireError` and the code → status table), `models` (wire
models), `security` (token file, bearer and Host checks, bind rules), `middleware` (body limit,
request id, abort on disconnect, access log), `routes` (the `/api/v1` routes), `stream` (the push
stream's `PushHub`), `deltas` (streamed text as `session/delta` frames), `markdown` (assistant
messages rendered and sanitized for the web UI) and `serve` (running it on uvicorn).
"""
