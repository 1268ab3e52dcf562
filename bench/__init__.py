"""jumpahead.bench: the `jumpahead bench KIND` benchmarks, apart from the server's code.

command.py dispatches `jumpahead bench KIND [ARGS]` to the module of KIND (its
`main(argv)`); bench/output.py prints a result as JSON and fails on outputs that differ.
Engine: decode.py (with context.py), fill.py (with echo.py), cache.py, attention.py.
Server: load.py, disconnect.py, crash.py (clients.py; the server process is live/server_process.py), proxy.py
(upstream mode), thinking_cache.py. Traces: forecast.py.

Only app/ is above this package (docs/design.md, Layers): nothing else imports from
here; app/cli.py names `jumpahead bench` by module string.
"""
