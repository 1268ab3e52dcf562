"""Strict fill: tokens the runtime already knows (tool-call scaffolding, grammars), the
tool-call formats of each model family, and the grammar compiler over xgrammar.

Imports engine/methods (a fill is a proposal) and the rooms below it."""
