"""The protocol-neutral turn: what every wire protocol, policy and trace shares.

`Turn` and its messages (core/turn.py), the `Exchange` a turn's hooks see
(core/exchange.py), prompt rendering (core/prompt.py), the runner that drives an
`Engine` for one turn (core/turn_runner.py), output parsing into reasoning / text / tool
calls (core/output_parser.py), script mode (core/script.py) and the errors every layer
answers with (core/errors.py). It imports only the engine (docs/design.md, Layers).
"""
