"""jumpahead.bench: the `jumpahead bench KIND` benchmarks, apart from the server's code.

command.py dispatches `jumpahead bench KIND [ARGS]` to the module of KIND (its
`main(argv)`); output.py prints a result as JSON and fails on outputs that differ.
Engine: decode.py (with context.py), fill.py (with echo.py), cache.py, attention.py.
Server: load.py, disconnect.py, crash.py (clients.py, server_process.py), proxy.py
(upstream mode), thinking_cache.py. Traces: forecast.py.

Nothing in engine/, proxy/, policies/ or traces/ imports from here, except the
`jumpahead bench` line of app/cli.py and `jumpahead replay` using output.emit.
"""
